package umjoin.spark

import org.apache.spark.SparkEnv
import org.apache.spark.sql.SparkSessionExtensions
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan
import org.apache.spark.sql.catalyst.rules.Rule
import org.apache.spark.sql.execution.{ColumnarRule, SparkPlan}

import umjoin.spark.batch.{BatchUMJoinStrategy, BroadcastStageInputs}
import umjoin.spark.core.tsc.{LogicalPatterns, MemberPatterns, PhysicalPatterns}
import umjoin.spark.streaming.{StreamAntiJoins, StreamingPlannerStrategy, StreamingUMJoinRule,
  WholeMicroBatchStrategy,
  WindowJoinSlices}

/**
 * Registers UMJoin with a Spark session: `spark.sql.extensions=umjoin.spark.UMJoinExtensions`
 * (plus the jar on `spark.jars`): the batch planner strategy and the streaming physical rule (with
 * the strategy that keeps Spark from planning its micro-batches adaptively where it must see them
 * whole). The member patterns are loaded and checked here, so a broken rules file fails the
 * session's creation with a message naming the file.
 */
class UMJoinExtensions extends (SparkSessionExtensions => Unit) {
  override def apply(extensions: SparkSessionExtensions): Unit = {
    val rulesDir = Option(SparkEnv.get).flatMap(_.conf.getOption(UMJoinConf.RulesDir.key))
    val batchPatterns = UMJoinExtensions.loadBatchPatterns(rulesDir)
    val streamingPatterns = MemberPatterns.load("streaming", rulesDir, PhysicalPatterns.vocabulary)
    // Spark asks for the strategy at every planning call: keep construction cheap.
    extensions.injectPlannerStrategy(session => new BatchUMJoinStrategy(session, batchPatterns))
    extensions.injectQueryPostPlannerStrategyRule(_ => BroadcastStageInputs)
    // Plans a micro-batch's stream-stream joins from its logical plan, before Spark's strategy.
    extensions.injectPlannerStrategy(session =>
      new StreamingPlannerStrategy(session, new StreamingUMJoinRule(session, streamingPatterns)))
    // Keeps micro-batches that may store static tables whole under AQE, for the streaming hook.
    extensions.injectPlannerStrategy(session => new WholeMicroBatchStrategy(session))
    // Left anti joins of two streams, as left outer joins keeping the padded rows, before Spark
    // checks the streaming plan.
    extensions.injectPostHocResolutionRule(_ => StreamAntiJoins)
    // Stream-stream joins without an equi-join key, keyed by time slice before Spark plans them.
    extensions.injectPreCBORule(_ => WindowJoinSlices)
    // The streaming hook runs on prepared physical plans, where stream-stream joins have their
    // state.
    extensions.injectColumnar(session => new ColumnarRule {
      override def preColumnarTransitions: Rule[SparkPlan] =
        new StreamingUMJoinRule(session, streamingPatterns)
    })
  }
}

object UMJoinExtensions {
  def loadBatchPatterns(rulesDir: Option[String]): MemberPatterns[LogicalPlan] =
    MemberPatterns.load("batch", rulesDir, LogicalPatterns.vocabulary)
}
