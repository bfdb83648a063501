package umjoin.spark

import java.io.File
import java.util.Locale

import org.apache.spark.network.util.JavaUtils
import org.apache.spark.sql.internal.SQLConf

import umjoin.spark.core.cost.{ProbeOrderPolicy, ProbeOrderSettings, Smoothing, StaticCacheMode,
  StaticCacheSettings}
import umjoin.spark.core.store.{RocksDBSettings, StateBackend, StoreSettings}
import umjoin.spark.streaming.StaticTablesMode

/**
 * The session settings under `spark.umjoin.*`, parsed and checked. They are read at every
 * planning, so `spark.conf.set` takes effect at the next query; an invalid value fails that query
 * with a message naming the key, the value and what is accepted.
 */
final case class UMJoinConf(
    enabled: Boolean,
    minInputs: Option[Int],
    convertBroadcastJoins: Boolean,
    stores: StoreSettings,
    stateTtlMs: Option[Long],
    stateCacheRows: Long,
    staticTables: StaticTablesMode,
    staticCache: StaticCacheSettings,
    probeOrder: ProbeOrderSettings,
    timeSlices: Option[Int]) {

  /**
   * The fewest inputs a group needs to be converted: the setting, else 3 (two inputs are a plain
   * hash join), or 2 for a streaming group with a join without an equi-join key, which UMJoin
   * spreads over the state partitions by time slice where Spark's join keeps it in one partition.
   */
  def minInputsOf(timeSliced: Boolean): Int = minInputs.getOrElse(if (timeSliced) 2 else 3)
}

/**
 * One `spark.umjoin.*` setting, declared once: its key, its default as the text `spark.conf.set`
 * would take (None: unset), what it accepts (the words of the error message), what it does (the
 * README's configuration table is rendered from these, see [[UMJoinConf.markdownTable]]), and
 * whether it is static (read once, when the session starts).
 */
final case class Setting[T](
    key: String,
    default: Option[String],
    accepts: String,
    doc: String,
    parse: String => Option[T],
    static: Boolean = false) {

  /** The value in `conf`, or the default; None when neither is set. */
  def read(conf: String => Option[String]): Option[T] =
    conf(key).orElse(default)
      .map(value => parse(value).getOrElse(throw new IllegalArgumentException(
        s"Invalid value '$value' for $key: expected $accepts. " +
          s"Fix it with spark.conf.set(\"$key\", ...) or remove the setting to use the default.")))

  def apply(conf: String => Option[String]): T =
    read(conf).getOrElse(
      throw new IllegalStateException(s"$key has no default; read it with `read`"))
}

object Setting {
  def boolean(key: String, default: Boolean, doc: String): Setting[Boolean] =
    Setting(key, Some(default.toString), "true or false", doc,
      _.trim.toLowerCase(Locale.ROOT).toBooleanOption)

  def int(key: String, default: Int, min: Int, doc: String): Setting[Int] =
    Setting(key, Some(default.toString), s"an integer >= $min", doc,
      _.trim.toIntOption.filter(_ >= min))

  def number(key: String, default: Double, min: Double, max: Double, doc: String): Setting[Double] =
    Setting(key, Some(default.toString),
      if (max == Double.MaxValue) s"a number >= $min" else s"a number from $min to $max", doc,
      _.trim.toDoubleOption.filter(v => v >= min && v <= max))

  def size(key: String, default: Option[String], min: Long, doc: String): Setting[Long] =
    Setting(key, default, s"a size such as 64k, 8m or 1g, at least $min bytes", doc, value =>
      (try Some(JavaUtils.byteStringAsBytes(value.trim))
      catch { case _: NumberFormatException => None }).filter(_ >= min))

  def duration(key: String, default: Option[String], doc: String): Setting[Long] =
    Setting(key, default, "a positive duration such as 30s, 10m or 2h", doc, value =>
      (try Some(JavaUtils.timeStringAsMs(value.trim))
      catch { case _: NumberFormatException => None }).filter(_ > 0))

  /**
   * `auto` (None: the setting's reader decides) or an integer of at least `min`; `auto` by default.
   */
  def autoOrInt(key: String, min: Int, doc: String): Setting[Option[Int]] =
    Setting(key, Some("auto"), s"auto or an integer >= $min", doc,
      value => value.trim.toLowerCase(Locale.ROOT) match {
        case "auto" => Some(None)
        case number => number.toIntOption.filter(_ >= min).map(Some(_))
      })

  /**
   * One of `byName`'s keys, case-sensitive where `caseSensitive` (the policies' camel-case names).
   */
  def choice[T](key: String, default: String, byName: Map[String, T], doc: String,
      caseSensitive: Boolean = false): Setting[T] =
    Setting(key, Some(default), byName.keys.toSeq.sorted.mkString(" or "), doc, value => {
      val name = value.trim
      byName.get(if (caseSensitive) name else name.toLowerCase(Locale.ROOT))
    })
}

object UMJoinConf {
  val Enabled: Setting[Boolean] = Setting.boolean("spark.umjoin.enabled", default = true,
    "convert join trees into UMJoin nodes in this session")
  val MinInputs: Setting[Option[Int]] = Setting.autoOrInt("spark.umjoin.minInputs", min = 2,
    "smallest group converted. `auto`: 3 (a 2-input group is a plain hash join), and 2 for " +
      "a stream-stream join without an equi-join key, which a StreamingUMJoin spreads over the " +
      "state partitions by time slice where Spark's join keeps all its state in one (see [Joins " +
      "without an equi-join key](docs/streaming.md#joins-without-an-equi-join-key))")
  val ConvertBroadcastJoins: Setting[Boolean] =
    Setting.boolean("spark.umjoin.convertBroadcastJoins", default = false,
      "batch: also convert a group whose joins Spark plans as broadcast joins, every one. Those " +
        "shuffle no intermediate result and run in Spark's generated code, so a UMJoin saves " +
        "nothing there and measured slower (see [Batch](docs/benchmarks.md)); by default such " +
        "a group stays Spark's, with the reason in `umjoin.plans.why_not`")
  val RulesDir: Setting[String] =
    Setting("spark.umjoin.rulesDir", None, "a directory", static = true,
      doc = "a directory holding `batch.yaml` and `streaming.yaml` " +
        "that replace the built-in member patterns (default: the rules built into the jar)",
      parse = value => Some(value))
  val StateBackendSetting: Setting[StateBackend] =
    Setting.choice("spark.umjoin.stateBackend", "auto", StateBackend.byName,
      "batch: where the stores a UMJoin task builds live: `memory` (Spark's memory-managed hash " +
        "map; a store that does not fit fails the task, as Spark's hash joins do), `rocksdb` " +
        "(an LSM-tree on local disk), `auto` (in memory, moved to RocksDB when Spark's memory " +
        "manager refuses more)")
  val MaxStoreMemory: Setting[Long] =
    Setting.size("spark.umjoin.auto.maxStoreMemory", None, min = 0,
      "batch, with `auto`: a store also moves to RocksDB once its in-memory size passes this " +
        "(e.g. `64m`), leaving memory to the operators above (default: only when Spark's memory " +
        "manager refuses memory)")
  val WriteBufferSize: Setting[Long] =
    Setting.size("spark.umjoin.rocksdb.writeBufferSize", Some("8m"), min = 64L * 1024,
      "batch: one memtable (skip list) per store; a store has at most two, the active " +
        "one and one being flushed to disk (a streaming UMJoin's state stores read Spark's " +
        "`spark.sql.streaming.stateStore.rocksdb.*` settings)")
  val BlockCacheSize: Setting[Long] =
    Setting.size("spark.umjoin.rocksdb.blockCacheSize", Some("8m"), min = 0,
      "batch: per store, the LRU cache of SST blocks read from disk (`0`: none)")
  val BloomFilterBitsPerKey: Setting[Int] =
    Setting.int("spark.umjoin.rocksdb.bloomFilterBitsPerKey", default = 10, min = 0,
      "batch: bloom filter bits per key in SST files (`0`: no filter)")
  val LocalDir: Setting[String] =
    Setting("spark.umjoin.rocksdb.localDir", None, "a directory UMJoin can create or write to",
      "batch: stores are created under `<dir>/umjoin-stores/` and " +
        "deleted when their task ends, fails or is killed (default: Spark's first local directory)",
      parse = writableDirectory)
  val ProbeOrderSetting: Setting[ProbeOrderPolicy] = Setting.choice("spark.umjoin.probeOrder",
    "fixed", ProbeOrderPolicy.byName,
    "the order a row probes the other inputs' stores in (see [Probe " +
      "order](docs/design.md#probe-order)): `fixed` (the plan's order), `selectivityFirst` " +
      "(the store returning the fewest rows per probe next, as MJoin), `greedy` (the cheapest " +
      "next step, as MultiStream), `dpPick` (the whole sequence of least expected cost, paper 001)",
    caseSensitive = true)
  val CycleRows: Setting[Int] =
    Setting.int("spark.umjoin.dpPick.cycleRows", default = 10000, min = 1,
      "batch: an adaptive policy chooses again after this many streamed rows of a task")
  val Period: Setting[Long] = Setting.duration("spark.umjoin.dpPick.period", Some("1s"),
    "streaming: an adaptive policy chooses again between micro-batches once this much time " +
      "passed since its last choice (the paper's T)")
  val History: Setting[Int] = Setting.int("spark.umjoin.dpPick.history", default = 20, min = 1,
    "cycles of statistics the forecast looks at (the paper's L)")
  val SmoothingSetting: Setting[Boolean] =
    Setting.boolean("spark.umjoin.dpPick.smoothing", default = true,
      "forecast the next cycle's statistics by double exponential smoothing; `false`: use the " +
        "last cycle's")
  val Alpha: Setting[Double] = Setting.number("spark.umjoin.dpPick.alpha", 0.5, 0.0, 1.0,
    "smoothing factor of the level")
  val Beta: Setting[Double] = Setting.number("spark.umjoin.dpPick.beta", 0.3, 0.0, 1.0,
    "smoothing factor of the trend")
  val Damping: Setting[Double] = Setting.number("spark.umjoin.dpPick.damping", 0.9, 0.0, 1.0,
    "damping of the match rate's trend")
  val QueryCost: Setting[Double] =
    Setting.number("spark.umjoin.dpPick.queryCost", 1.0, 0.0, Double.MaxValue,
      "cost coefficient alpha_q of Eq. 8, per store lookup (times f(keys)); `0` drops that term")
  val MatchCost: Setting[Double] =
    Setting.number("spark.umjoin.dpPick.matchCost", 1.0, 0.0, Double.MaxValue,
      "cost coefficient alpha_m of Eq. 8, per matched row; `0` drops that term")
  val StateCacheRows: Setting[Int] =
    Setting.int("spark.umjoin.stateCacheRows", default = 0, min = 0,
      "streaming: where a task's partition of a stream's stored rows holds at most this many " +
        "(as committed by the previous micro-batch on the same executor), the task reads them " +
        "into memory once per micro-batch and probes them there instead of the state store (`0`: " +
        "never). A hash lookup costs less than a seek in RocksDB, but the copies take memory " +
        "beside the state store's: off by default, since Spark's joins keep no such copies")
  val StaticTables: Setting[StaticTablesMode] =
    Setting.choice("spark.umjoin.staticTables", "auto", StaticTablesMode.byName,
      "streaming: a static table too big to broadcast, read from files, is `store`d in the " +
        "StreamingUMJoin's state (loaded when the query starts and when the table changes; see " +
        "[Static tables](docs/streaming.md#static-tables-in-a-streaming-join)) or `reread` every " +
        "micro-batch as Spark's stream-static join reads it (then one stream with static tables " +
        "stays as Spark planned it); `auto` stores it where Spark estimates it at 1,000,000 rows " +
        "or more and 100 times the micro-batch's stream rows, since storing costs a state-store " +
        "lookup per probe and saves reading the table: smaller tables are faster read again " +
        "(measured: `make bench-static`). A checkpoint keeps the choice it was started with")
      .copy(accepts = "auto, store or reread")
  val StaticCache: Setting[StaticCacheMode] =
    Setting.choice("spark.umjoin.staticCache", "ssbj", StaticCacheMode.byName,
      "streaming: what each executor keeps in memory of a stored static table: `ssbj` " +
        "the rows of the keys paper 003's cache inequality chooses from the probes of earlier " +
        "micro-batches, `all` every row of the partition (when it fits `maxBytes`; else none), " +
        "`off` none (every probe reads the store)")
  val StaticCacheMaxBytes: Setting[Long] =
    Setting.size("spark.umjoin.staticCache.maxBytes", Some("16m"), min = 0,
      "memory of one partition's cache of one static table (so an executor may hold this times " +
        "the partitions it runs, per table); keys are admitted most disk bytes saved per cached " +
        "byte first while they fit")
  val StaticCacheHysteresis: Setting[Double] =
    Setting.number("spark.umjoin.staticCache.hysteresis", 1.0, 1.0, Double.MaxValue,
      "the paper's s_f: a key enters the cache when n*v_S > s_f*m*v_R and leaves when m*v_R >= " +
        "s_f*n*v_S, so keys near the balance do not move back and forth")
  val StateTtl: Setting[Long] = Setting.duration("spark.umjoin.stateTtl", None,
    "streaming: a stored row is removed once it was stored longer ago than this (e.g. `2h`), " +
      "before a batch probes. Bounds state for streams without watermarks; **changes results**, " +
      "as Flink's state TTL does (default: kept until watermarks evict it)")
  val TimeSlices: Setting[Option[Int]] = Setting.autoOrInt("spark.umjoin.timeSlices", min = 1,
    "streaming, joins without an equi-join key: how many time slices the event " +
      "times a stream's row joins across are cut into, each slice's rows in one state partition " +
      "(see [Joins without an equi-join key](docs/streaming.md#joins-without-an-equi-join-key)); " +
      "a combination is probed in the partitions of the slices its time range overlaps. `auto`: " +
      "at first Spark's default parallelism (`spark.default.parallelism`, else the application's " +
      "cores), at most the state partitions; then, per stream, the count of least predicted time " +
      "by paper 004's cost model from the costs the micro-batch before measured (rows tested and " +
      "their time, combinations shipped and theirs), where it beats the current one by 20%. When " +
      "the count changes between micro-batches (so chosen, or this setting before a restart: " +
      "from the second micro-batch after it), the new slices start past the stored rows' " +
      "event times, which stay where they are until they expire. With either, slices past a " +
      "micro-batch whose rows came at another rate than the stored ones' are narrower or wider, " +
      "so that each holds about as many rows")

  /** Every setting, in the order the README's table lists them. */
  val all: Seq[Setting[_]] = Seq(Enabled, MinInputs, ConvertBroadcastJoins, RulesDir,
    StateBackendSetting, MaxStoreMemory, WriteBufferSize, BlockCacheSize, BloomFilterBitsPerKey,
    LocalDir, ProbeOrderSetting, CycleRows, Period, History, SmoothingSetting, Alpha, Beta,
    Damping, QueryCost, MatchCost, StateCacheRows, StaticTables, StaticCache, StaticCacheMaxBytes,
    StaticCacheHysteresis, StateTtl, TimeSlices)

  def from(conf: SQLConf): UMJoinConf = {
    val get: String => Option[String] = key => Option(conf.getConfString(key, null))
    UMJoinConf(
      enabled = Enabled(get),
      minInputs = MinInputs(get),
      convertBroadcastJoins = ConvertBroadcastJoins(get),
      stores = StoreSettings(
        StateBackendSetting(get),
        RocksDBSettings(WriteBufferSize(get),
          BlockCacheSize(get), BloomFilterBitsPerKey(get), LocalDir.read(get)),
        maxStoreMemory = MaxStoreMemory.read(get)),
      stateTtlMs = StateTtl.read(get),
      stateCacheRows = StateCacheRows(get).toLong,
      staticTables = StaticTables(get),
      staticCache = StaticCacheSettings(StaticCache(get),
        StaticCacheMaxBytes(get), StaticCacheHysteresis(get)),
      probeOrder = ProbeOrderSettings(
        policy = ProbeOrderSetting(get),
        cycleRows = CycleRows(get).toLong,
        periodMs = Period(get),
        history = History(get),
        smoothing = Option.when(SmoothingSetting(get))(Smoothing(Alpha(get),
          Beta(get), Damping(get))),
        alphaQuery = QueryCost(get),
        alphaMatch = MatchCost(get)),
      timeSlices = TimeSlices(get))
  }

  /**
   * The README's configuration table (`make readme-settings` writes it there; a test checks it is
   * current).
   */
  def markdownTable: String = {
    def cell(text: String): String = text.replace("|", "\\|")
    val rows = all.map { s =>
      val what = (if (s.static) "*static* (read when the session starts): " else "") + s.doc
      s"| `${s.key}` | ${s.default.fold("none")(d => s"`$d`")} | ${cell(s.accepts)} | " +
        s"${cell(what)} |"
    }
    ("| setting | default | accepts | meaning |" +: "|---|---|---|---|" +: rows).mkString("\n")
  }

  /** Prints [[markdownTable]]: `java -cp <jar>:<Spark's jars> umjoin.spark.UMJoinConf`. */
  def main(args: Array[String]): Unit = println(markdownTable)

  private def writableDirectory(path: String): Option[String] = {
    val dir = new File(path)
    if (!dir.isDirectory) dir.mkdirs()
    Option.when(dir.isDirectory && dir.canWrite)(path)
  }
}
