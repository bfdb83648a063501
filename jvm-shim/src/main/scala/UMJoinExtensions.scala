package umjoin.spark

import org.apache.spark.SparkEnv
import org.apache.spark.sql.SparkSessionExtensions
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan

import umjoin.spark.batch.{BatchUMJoinStrategy, BroadcastStageInputs}
import umjoin.spark.core.tsc.{LogicalPatterns, MemberPatterns, PhysicalPatterns}
import umjoin.spark.streaming.{StreamAntiJoins, StreamingGroupPlanner, StreamingPlannerStrategy,
  WindowJoinSlices}

/**
 * Registers UMJoin with a Spark session: `spark.sql.extensions=umjoin.spark.UMJoinExtensions`
 * (plus the jar on `spark.jars`): the batch and the streaming planner strategies and the rules
 * that prepare their plans. The member patterns are loaded and checked here, so a broken rules
 * file fails the session's creation with a message naming the file.
 */
class UMJoinExtensions extends (SparkSessionExtensions => Unit) {
  override def apply(extensions: SparkSessionExtensions): Unit = {
    val rulesDir = Option(SparkEnv.get).flatMap(_.conf.getOption(UMJoinConf.RulesDir.key))
    val batchPatterns = UMJoinExtensions.loadBatchPatterns(rulesDir)
    val streamingPatterns = MemberPatterns.load("streaming", rulesDir, PhysicalPatterns.vocabulary)
    // Spark asks for the strategy at every planning call: keep construction cheap.
    extensions.injectPlannerStrategy(session => new BatchUMJoinStrategy(session, batchPatterns))
    extensions.injectQueryPostPlannerStrategyRule(_ => BroadcastStageInputs)
    // Plans a micro-batch's joins of streams from its logical plan, before Spark's strategies.
    extensions.injectPlannerStrategy(session =>
      new StreamingPlannerStrategy(session, new StreamingGroupPlanner(session, streamingPatterns)))
    // Left anti joins of two streams, as left outer joins keeping the padded rows, before Spark
    // checks the streaming plan.
    extensions.injectPostHocResolutionRule(_ => StreamAntiJoins)
    // Stream-stream joins without an equi-join key, keyed by time slice before Spark plans them.
    extensions.injectPreCBORule(_ => WindowJoinSlices)
  }
}

object UMJoinExtensions {
  def loadBatchPatterns(rulesDir: Option[String]): MemberPatterns[LogicalPlan] =
    MemberPatterns.load("batch", rulesDir, LogicalPatterns.vocabulary)
}
