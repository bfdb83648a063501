package umjoin.spark

import java.io.File

import org.apache.spark.network.util.JavaUtils
import org.apache.spark.sql.internal.SQLConf

import umjoin.spark.order.{ProbeOrderPolicy, ProbeOrderSettings, Smoothing}
import umjoin.spark.state.{RocksDBSettings, StateBackend, StaticCacheMode, StaticCacheSettings, StoreSettings}

/**
 * The session settings under `spark.umjoin.*`, parsed and checked. They are read at every
 * planning, so `spark.conf.set` takes effect at the next query; an invalid value fails that query
 * with a message naming the key, the value and what is accepted.
 */
final case class UMJoinConf(
    enabled: Boolean,
    minInputs: Int,
    stores: StoreSettings,
    stateTtlMs: Option[Long],
    stateCacheRows: Long,
    storeStaticTables: Boolean,
    staticCache: StaticCacheSettings,
    probeOrder: ProbeOrderSettings)

object UMJoinConf {
  val Enabled = "spark.umjoin.enabled"
  val MinInputs = "spark.umjoin.minInputs"
  val StateBackendKey = "spark.umjoin.stateBackend"
  val WriteBufferSize = "spark.umjoin.rocksdb.writeBufferSize"
  val BlockCacheSize = "spark.umjoin.rocksdb.blockCacheSize"
  val BloomFilterBitsPerKey = "spark.umjoin.rocksdb.bloomFilterBitsPerKey"
  val LocalDir = "spark.umjoin.rocksdb.localDir"
  val MaxStoreMemory = "spark.umjoin.auto.maxStoreMemory"
  val StateTtl = "spark.umjoin.stateTtl"
  val StateCacheRows = "spark.umjoin.stateCacheRows"
  val StaticTables = "spark.umjoin.staticTables"
  val StaticCache = "spark.umjoin.staticCache"
  val StaticCacheMaxBytes = "spark.umjoin.staticCache.maxBytes"
  val StaticCacheHysteresis = "spark.umjoin.staticCache.hysteresis"
  val ProbeOrderKey = "spark.umjoin.probeOrder"
  val CycleRows = "spark.umjoin.dpPick.cycleRows"
  val Period = "spark.umjoin.dpPick.period"
  val History = "spark.umjoin.dpPick.history"
  val SmoothingKey = "spark.umjoin.dpPick.smoothing"
  val Alpha = "spark.umjoin.dpPick.alpha"
  val Beta = "spark.umjoin.dpPick.beta"
  val Damping = "spark.umjoin.dpPick.damping"
  val QueryCost = "spark.umjoin.dpPick.queryCost"
  val MatchCost = "spark.umjoin.dpPick.matchCost"
  /** Static (read when the session starts): a directory of member-pattern files replacing the built-in rules. */
  val RulesDir = "spark.umjoin.rulesDir"

  def from(conf: SQLConf): UMJoinConf = {
    val backend = conf.getConfString(StateBackendKey, "auto").trim.toLowerCase(java.util.Locale.ROOT)
    val stores = StoreSettings(
      StateBackend.byName.getOrElse(backend,
        throw invalid(StateBackendKey, backend, StateBackend.byName.keys.toSeq.sorted.mkString(" or "))),
      RocksDBSettings(
        writeBufferSize = parseSize(WriteBufferSize, conf.getConfString(WriteBufferSize, "8m"), min = 64L * 1024),
        blockCacheSize = parseSize(BlockCacheSize, conf.getConfString(BlockCacheSize, "8m"), min = 0),
        bloomFilterBitsPerKey = parseInt(BloomFilterBitsPerKey, conf.getConfString(BloomFilterBitsPerKey, "10"), min = 0),
        localDir = Option(conf.getConfString(LocalDir, null)).map(checkedDirectory)),
      maxStoreMemory = Option(conf.getConfString(MaxStoreMemory, null)).map(parseSize(MaxStoreMemory, _, min = 0)))
    UMJoinConf(
      enabled = parseBoolean(Enabled, conf.getConfString(Enabled, "true")),
      minInputs = parseInt(MinInputs, conf.getConfString(MinInputs, "3"), min = 2),
      stores = stores,
      stateTtlMs = Option(conf.getConfString(StateTtl, null)).map(parseDuration(StateTtl, _)),
      stateCacheRows = parseInt(StateCacheRows, conf.getConfString(StateCacheRows, "100000"), min = 0).toLong,
      storeStaticTables = conf.getConfString(StaticTables, "store").trim.toLowerCase(java.util.Locale.ROOT) match {
        case "store" => true
        case "reread" => false
        case other => throw invalid(StaticTables, other, "store or reread")
      },
      staticCache = staticCacheSettings(conf),
      probeOrder = probeOrderSettings(conf))
  }

  private def staticCacheSettings(conf: SQLConf): StaticCacheSettings = {
    val mode = conf.getConfString(StaticCache, "ssbj").trim.toLowerCase(java.util.Locale.ROOT)
    StaticCacheSettings(
      StaticCacheMode.byName.getOrElse(mode, throw invalid(StaticCache, mode, StaticCacheMode.byName.keys.toSeq.sorted.mkString(" or "))),
      maxBytes = parseSize(StaticCacheMaxBytes, conf.getConfString(StaticCacheMaxBytes, "16m"), min = 0),
      hysteresis = parseDouble(StaticCacheHysteresis, conf.getConfString(StaticCacheHysteresis, "1.0"), 1.0, Double.MaxValue))
  }

  private def probeOrderSettings(conf: SQLConf): ProbeOrderSettings = {
    val name = conf.getConfString(ProbeOrderKey, "fixed").trim
    val policy = ProbeOrderPolicy.byName.getOrElse(name,
      throw invalid(ProbeOrderKey, name, ProbeOrderPolicy.byName.keys.toSeq.sorted.mkString(" or ")))
    def fraction(key: String, default: String): Double = parseDouble(key, conf.getConfString(key, default), 0.0, 1.0)
    ProbeOrderSettings(
      policy = policy,
      cycleRows = parseInt(CycleRows, conf.getConfString(CycleRows, "10000"), min = 1).toLong,
      periodMs = parseDuration(Period, conf.getConfString(Period, "1s")),
      history = parseInt(History, conf.getConfString(History, "20"), min = 1),
      smoothing = Option.when(parseBoolean(SmoothingKey, conf.getConfString(SmoothingKey, "true")))(
        Smoothing(fraction(Alpha, "0.5"), fraction(Beta, "0.3"), fraction(Damping, "0.9"))),
      alphaQuery = parseDouble(QueryCost, conf.getConfString(QueryCost, "1.0"), 0.0, Double.MaxValue),
      alphaMatch = parseDouble(MatchCost, conf.getConfString(MatchCost, "1.0"), 0.0, Double.MaxValue))
  }

  private def parseDouble(key: String, value: String, min: Double, max: Double): Double =
    value.trim.toDoubleOption.filter(v => v >= min && v <= max)
      .getOrElse(throw invalid(key, value, if (max == Double.MaxValue) s"a number >= $min" else s"a number from $min to $max"))

  private def parseSize(key: String, value: String, min: Long): Long = {
    val bytes = try Some(JavaUtils.byteStringAsBytes(value.trim)) catch { case _: NumberFormatException => None }
    bytes.filter(_ >= min).getOrElse(throw invalid(key, value, s"a size such as 64k, 8m or 1g, at least $min bytes"))
  }

  private def parseDuration(key: String, value: String): Long = {
    val ms = try Some(JavaUtils.timeStringAsMs(value.trim)) catch { case _: NumberFormatException => None }
    ms.filter(_ > 0).getOrElse(throw invalid(key, value, "a positive duration such as 30s, 10m or 2h"))
  }

  private def checkedDirectory(path: String): String = {
    val dir = new File(path)
    if (!dir.isDirectory) dir.mkdirs()
    if (!dir.isDirectory || !dir.canWrite) throw invalid(LocalDir, path, "a directory UMJoin can create or write to")
    path
  }

  private def parseBoolean(key: String, value: String): Boolean =
    value.trim.toLowerCase(java.util.Locale.ROOT) match {
      case "true" => true
      case "false" => false
      case _ => throw invalid(key, value, "true or false")
    }

  private def parseInt(key: String, value: String, min: Int): Int =
    value.trim.toIntOption match {
      case Some(n) if n >= min => n
      case _ => throw invalid(key, value, s"an integer >= $min")
    }

  private def invalid(key: String, value: String, expected: String) =
    new IllegalArgumentException(
      s"Invalid value '$value' for $key: expected $expected. " +
        s"Fix it with spark.conf.set(\"$key\", ...) or remove the setting to use the default.")
}
