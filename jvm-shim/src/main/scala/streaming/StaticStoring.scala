package umjoin.spark.streaming

import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan
import org.apache.spark.sql.catalyst.plans.logical.statsEstimation.EstimationUtils

/**
 * Whether a streaming UMJoin stores a static table too big to broadcast
 * (spark.umjoin.staticTables).
 */
sealed trait StaticTablesMode {
  def name: String
}

object StaticTablesMode {
  /** Stored where storing is expected to pay ([[StaticStoring.pays]]), else read again. */
  case object Auto extends StaticTablesMode { override val name = "auto" }
  /** Stored wherever it can be (read from files, the same rows every micro-batch). */
  case object Store extends StaticTablesMode { override val name = "store" }
  /** Read again every micro-batch, as Spark's stream-static join reads it. */
  case object Reread extends StaticTablesMode { override val name = "reread" }

  val byName: Map[String, StaticTablesMode] = Seq(Auto, Store, Reread).map(m => m.name -> m).toMap
}

/**
 * When storing a static table pays. Spark's stream-static join reads and shuffles the whole table
 * in every micro-batch; a stored table costs a state-store lookup per stream row and its stores'
 * commit instead. Measured (`make bench-static`, and by hand its query over micro-batches of 1,500
 * orders; RocksDB, 4 partitions): a stored `customer` of 150,000 rows was slower per micro-batch at
 * every batch size tried (1.1-2.2x Spark's), one of 750,000 rows with 1,500-order micro-batches
 * about 0.8x. So, by Spark's own estimates of the rows (no I/O), a table is stored only where it
 * has at least [[MinTableRows]] rows and [[TableRowsPerBatchRow]] times the rows of the
 * micro-batch's streams.
 */
object StaticStoring {
  val MinTableRows: Double = 1e6
  val TableRowsPerBatchRow: Double = 100.0

  /** Spark's estimate of a plan's rows: its row count, else its bytes over the width of a row. */
  def estimatedRows(plan: LogicalPlan): Double = {
    val stats = plan.stats
    stats.rowCount.map(_.toDouble).getOrElse(
      (stats.sizeInBytes / EstimationUtils.getSizePerRow(plan.output).max(1)).toDouble)
  }

  def pays(tableRows: Double, batchRows: Double): Boolean =
    tableRows >= MinTableRows && tableRows >= TableRowsPerBatchRow * batchRows

  /**
   * Whether `mode` stores a table of `tableRows` beside micro-batches of `batchRows` stream rows
   * (None where either is not known: then read again, as Spark does).
   */
  def stores(mode: StaticTablesMode, tableRows: Option[Double],
      batchRows: Option[Double]): Boolean = mode match {
    case StaticTablesMode.Store => true
    case StaticTablesMode.Reread => false
    case StaticTablesMode.Auto =>
      (for (t <- tableRows; b <- batchRows) yield pays(t, b)).getOrElse(false)
  }

  /** Why `auto` reads a table again, with the estimates it went by. */
  def rereadBecause(tableRows: Option[Double], batchRows: Option[Double]): String = {
    def shown(rows: Option[Double]) = rows.fold("no estimate")(r => f"about $r%.0f rows")
    s"Spark's estimates: the table ${shown(tableRows)}, the micro-batch's streams " +
      s"${shown(batchRows)}; spark.umjoin.staticTables=auto stores a table only from " +
      f"$MinTableRows%.0f rows and $TableRowsPerBatchRow%.0f times a micro-batch's rows, below " +
      "which Spark's stream-static join is faster; spark.umjoin.staticTables=store stores it anyway"
  }
}
