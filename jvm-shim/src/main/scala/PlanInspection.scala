package umjoin.spark

import org.json4s.JsonAST._
import org.json4s.jackson.JsonMethods.{compact, parse, render}

import org.apache.spark.SparkEnv
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan
import org.apache.spark.sql.catalyst.trees.TreeNode
import org.apache.spark.sql.execution.{BaseSubqueryExec, ExecSubqueryExpression, SparkPlan}
import org.apache.spark.sql.execution.adaptive.{AdaptiveSparkPlanExec, QueryStageExec}

import umjoin.spark.planning.InputLabels
import umjoin.spark.tsc.{MultiJoin, TwoStepConvert}

/** What the Python side asks the JVM about plans; every answer is JSON. */
object PlanInspection {

  /**
   * The physical plan with AQE's wrappers (adaptive plan, query stages) replaced by the plans
   * inside, in the plan and in its subqueries.
   */
  def unwrapped(plan: SparkPlan): SparkPlan = plan match {
    case adaptive: AdaptiveSparkPlanExec => unwrapped(adaptive.executedPlan)
    case stage: QueryStageExec => unwrapped(stage.plan)
    case other =>
      other.withNewChildren(other.children.map(unwrapped)).transformExpressions {
        case subquery: ExecSubqueryExpression => subquery.withNewPlan(unwrapped(subquery.plan).asInstanceOf[BaseSubqueryExec])
      }
  }

  /**
   * `{"nodes": [...], "text": [...], "metrics": [...], "subqueries": [...]}`: the TreeNode JSON of
   * `plan` (nodes in pre-order, each with its number of children), and for each node in the same
   * order its one-line description, its SQL metrics (display name -> value; physical plans only)
   * and the descriptions of the plans of its subqueries.
   */
  def describe[T <: TreeNode[T]](plan: T): String = compact(render(description(plan)))

  private def description[T <: TreeNode[T]](plan: T): JValue = {
    val text = plan.collect { case node => JString(node.simpleString(25)) }
    val metrics = plan.collect {
      case p: SparkPlan => JObject(p.metrics.toList.sortBy(_._1).map { case (_, m) => m.name.getOrElse(m.id.toString) -> JLong(m.value) })
      case _ => JObject()
    }
    val subqueries = plan.collect {
      case p: SparkPlan => JArray(p.subqueries.map(s => description(s)).toList)
      case p: LogicalPlan => JArray(p.subqueries.map(s => description(s)).toList)
      case _ => JArray(Nil)
    }
    JObject("nodes" -> parse(plan.toJSON), "text" -> JArray(text.toList), "metrics" -> JArray(metrics.toList),
      "subqueries" -> JArray(subqueries.toList))
  }

  /**
   * Runs both TSC steps on a logical plan with the session's batch member patterns, without any
   * planning decision: `{"groups": [{"root", "members", "inputs"}], "converted": <describe of the
   * plan with MultiJoin nodes>}`.
   */
  def twoStepConvert(plan: LogicalPlan): String = {
    val patterns = UMJoinExtensions.loadBatchPatterns(Option(SparkEnv.get).flatMap(_.conf.getOption(UMJoinConf.RulesDir)))
    val tsc = new TwoStepConvert[LogicalPlan](patterns.roleOf)
    val groups = tsc.createMultiJoinGroups(plan)
    val converted = tsc.getMultiJoinNode(plan, groups, (group, inputs) => MultiJoin(inputs, group.root.output))
    val groupJson = groups.map { g =>
      JObject(
        "root" -> JString(g.root.simpleString(25)),
        "members" -> JArray(g.members.map(m => JString(m.nodeName)).toList),
        "inputs" -> JArray(g.inputs.map(i => JString(InputLabels.of(i))).toList))
    }
    compact(render(JObject("groups" -> JArray(groupJson.toList), "converted" -> description(converted))))
  }
}
