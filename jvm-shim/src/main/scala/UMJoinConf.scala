package umjoin.spark

import org.apache.spark.sql.internal.SQLConf

/**
 * The session settings under `spark.umjoin.*`, parsed and checked. They are read at every
 * planning, so `spark.conf.set` takes effect at the next query; an invalid value fails that query
 * with a message naming the key, the value and what is accepted.
 */
final case class UMJoinConf(enabled: Boolean, minInputs: Int)

object UMJoinConf {
  val Enabled = "spark.umjoin.enabled"
  val MinInputs = "spark.umjoin.minInputs"
  /** Static (read when the session starts): a directory of member-pattern files replacing the built-in rules. */
  val RulesDir = "spark.umjoin.rulesDir"

  def from(conf: SQLConf): UMJoinConf = UMJoinConf(
    enabled = parseBoolean(Enabled, conf.getConfString(Enabled, "true")),
    minInputs = parseInt(MinInputs, conf.getConfString(MinInputs, "3"), min = 2))

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
