package umjoin.spark

import org.apache.spark.SparkEnv
import org.apache.spark.sql.SparkSessionExtensions

import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan

import umjoin.spark.planning.{BatchUMJoinStrategy, LogicalPatterns}
import umjoin.spark.tsc.MemberPatterns

/**
 * Registers UMJoin with a Spark session: `spark.sql.extensions=umjoin.spark.UMJoinExtensions`
 * (plus the jar on `spark.jars`). The member patterns are loaded and checked here, so a broken
 * rules file fails the session's creation with a message naming the file.
 */
class UMJoinExtensions extends (SparkSessionExtensions => Unit) {
  override def apply(extensions: SparkSessionExtensions): Unit = {
    val rulesDir = Option(SparkEnv.get).flatMap(_.conf.getOption(UMJoinConf.RulesDir))
    val batchPatterns = UMJoinExtensions.loadBatchPatterns(rulesDir)
    // Spark asks for the strategy at every planning call: keep construction cheap.
    extensions.injectPlannerStrategy(session => new BatchUMJoinStrategy(session, batchPatterns))
  }
}

object UMJoinExtensions {
  def loadBatchPatterns(rulesDir: Option[String]): MemberPatterns[LogicalPlan] =
    MemberPatterns.load("batch", rulesDir, LogicalPatterns.vocabulary)
}
