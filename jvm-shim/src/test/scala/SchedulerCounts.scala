package org.apache.spark.umjoin.testkit

import java.util.concurrent.atomic.AtomicInteger

import org.apache.spark.SparkContext
import org.apache.spark.scheduler.{SparkListener, SparkListenerJobStart,
  SparkListenerStageSubmitted}
import org.apache.spark.sql.execution.SQLExecution

/**
 * Counts, from [[SchedulerCounts.start]] to [[stop]], the jobs started outside any SQL execution
 * (their properties carry no execution id: in a streaming query, a job run while a micro-batch is
 * planned rather than executed) and the stages submitted (each broadcasts its tasks' binary). In
 * Spark's package for the listener bus's wait, which Spark keeps to itself.
 */
final class SchedulerCounts private (context: SparkContext) extends SparkListener {
  private val outside = new AtomicInteger()
  private val stages = new AtomicInteger()

  override def onJobStart(job: SparkListenerJobStart): Unit =
    if (Option(job.properties).forall(_.getProperty(SQLExecution.EXECUTION_ID_KEY) == null)) {
      outside.incrementAndGet()
    }

  override def onStageSubmitted(stage: SparkListenerStageSubmitted): Unit =
    stages.incrementAndGet()

  /** Stops counting once every event so far is heard. */
  def stop(): SchedulerCounts = {
    context.listenerBus.waitUntilEmpty()
    context.removeSparkListener(this)
    this
  }

  def jobsOutsideExecutions: Int = outside.get
  def stagesSubmitted: Int = stages.get
}

object SchedulerCounts {
  def start(context: SparkContext): SchedulerCounts = {
    val counter = new SchedulerCounts(context)
    context.addSparkListener(counter)
    counter
  }
}
