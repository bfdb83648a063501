package umjoin.spark

import org.json4s.JsonAST._
import org.json4s.jackson.JsonMethods.{compact, parse, render}

import org.apache.spark.SparkEnv
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan
import org.apache.spark.sql.catalyst.trees.TreeNode
import org.apache.spark.sql.execution.SparkPlan
import org.apache.spark.sql.execution.adaptive.{AdaptiveSparkPlanExec, QueryStageExec}
import org.apache.spark.sql.execution.QueryExecution
import org.apache.spark.sql.execution.streaming.runtime.StreamingQueryWrapper
import org.apache.spark.sql.execution.umjoin.ActiveQueries

import umjoin.spark.batch.{BatchUMJoinStrategy, InputLabels}
import umjoin.spark.core.tsc.{LogicalPatterns, MultiJoin, TwoStepConvert}
import umjoin.spark.streaming.StreamingRun

/** What the Python side asks the JVM about plans and probe orders; every answer is JSON. */
object PlanInspection {

  /**
   * `{"nodes": [...], "text": [...], "metrics": [...], "subqueries": [...]}`: the plan's nodes in
   * pre-order as TreeNode JSON (each with its number of children), and for each node in the same
   * order its one-line description, its SQL metrics (display name -> value; physical plans only)
   * and the descriptions of its subqueries' plans. AQE's wrappers (adaptive plan, query stages) are
   * seen through, never copied, so the metrics are those of the nodes that ran.
   */
  def describe[T <: TreeNode[T]](plan: T): String = compact(render(description(plan)))

  private[spark] def description[T <: TreeNode[T]](plan: T): JValue = {
    val nodes, text, metrics, subqueries = scala.collection.mutable.ArrayBuffer[JValue]()
    def visit(node: TreeNode[_]): Unit = {
      val shown = seeThrough(node)
      // The node's own entry: the first of its subtree's JSON (its children are described as
      // visited).
      nodes += (parse(shown.toJSON) match { case JArray(self :: _) => self; case other => other })
      text += JString(shown.simpleString(25))
      shown match {
        case p: SparkPlan =>
          metrics += JObject(p.metrics.toList.sortBy(_._1)
            .map { case (_, m) => m.name.getOrElse(m.id.toString) -> JLong(m.value) })
          subqueries += JArray(p.subqueries.map(s => description(s)).toList)
        case p: LogicalPlan =>
          metrics += JObject()
          subqueries += JArray(p.subqueries.map(s => description(s)).toList)
        case _ =>
          metrics += JObject()
          subqueries += JArray(Nil)
      }
      shown.children.foreach(child => visit(child.asInstanceOf[TreeNode[_]]))
    }
    visit(plan)
    JObject("nodes" -> JArray(nodes.toList), "text" -> JArray(text.toList),
      "metrics" -> JArray(metrics.toList),
      "subqueries" -> JArray(subqueries.toList))
  }

  /**
   * The node that ran in place of an AQE wrapper (the current plan of an adaptive plan, a stage's
   * plan).
   */
  private def seeThrough(node: TreeNode[_]): TreeNode[_] = node match {
    case adaptive: AdaptiveSparkPlanExec => seeThrough(adaptive.executedPlan)
    case stage: QueryStageExec => seeThrough(stage.plan)
    case other => other
  }

  /**
   * Why each join of a batch query stays as Spark plans it: `[[join, reason], ...]` (see
   * [[BatchUMJoinStrategy.whyNot]]).
   */
  def whyNot(execution: QueryExecution): String =
    compact(render(whyNotEntries(execution.executedPlan)))

  private[spark] def whyNotEntries(plan: SparkPlan): JArray =
    JArray(BatchUMJoinStrategy.whyNot(plan).map { case (_, join, reason) =>
      JArray(List(JString(join), JString(reason)))
    }.toList)

  /**
   * Why joins of a streaming query run (running or ended) stayed as Spark planned them: a JSON
   * array of messages.
   */
  def unconvertedStreamingJoins(query: StreamingQueryWrapper): String = {
    val run = StreamingRun.existing(ActiveQueries.sessionOf(query.streamingQuery))
    compact(render(JArray(run.toSeq.flatMap(_.unconverted).map(JString(_)).toList)))
  }

  /**
   * Runs both TSC steps on a logical plan with the session's batch member patterns, without any
   * planning decision: `{"groups": [{"root", "members", "inputs"}], "converted": <describe of the
   * plan with MultiJoin nodes>}`.
   */
  def twoStepConvert(plan: LogicalPlan): String = {
    val patterns = UMJoinExtensions.loadBatchPatterns(
      Option(SparkEnv.get).flatMap(_.conf.getOption(UMJoinConf.RulesDir.key)))
    val tsc = new TwoStepConvert[LogicalPlan](patterns.roleOf, LogicalPatterns.keptAsInput)
    val groups = tsc.createMultiJoinGroups(plan)
    val converted =
      tsc.getMultiJoinNode(plan, groups, (group, inputs) => MultiJoin(inputs, group.root.output))
    val groupJson = groups.map { g =>
      JObject(
        "root" -> JString(g.root.simpleString(25)),
        "members" -> JArray(g.members.map(m => JString(m.nodeName)).toList),
        "inputs" -> JArray(g.inputs.map(i => JString(InputLabels.of(i))).toList))
    }
    compact(render(JObject("groups" -> JArray(groupJson.toList),
      "converted" -> description(converted))))
  }
}
