package umjoin.spark

import org.json4s.JsonAST.JObject
import org.json4s.jackson.JsonMethods.{compact, render}

import org.apache.spark.sql.ExtendedExplainGenerator
import org.apache.spark.sql.execution.SparkPlan

/**
 * The plan as the Python package reads it, for a client that cannot reach the driver's JVM (Spark
 * Connect): one line of JSON, `{"plan": <PlanInspection.describe>, "whyNot": [[join, reason]]}`,
 * under "UMJoin description" in `explain("extended")`. The package names this provider in
 * spark.sql.extendedExplainProviders only for the explain it asks for, so users' explains never
 * show it.
 */
final class UMJoinDescription extends ExtendedExplainGenerator {
  override def title: String = "UMJoin description"

  override def generateExtendedInfo(plan: SparkPlan): String = compact(render(JObject(
    "plan" -> PlanInspection.description(plan),
    "whyNot" -> PlanInspection.whyNotEntries(plan))))
}
