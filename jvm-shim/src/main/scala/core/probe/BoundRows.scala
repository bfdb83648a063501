package umjoin.spark.core.probe

import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.util.{ArrayData, MapData}
import org.apache.spark.sql.types.{DataType, Decimal}
import org.apache.spark.unsafe.types.{BinaryView, CalendarInterval, TimestampNanosVal,
  UTF8String, VariantVal}

/**
 * Rows a probe route has bound, read as one row: the fields of `slots(s)` for each s of `included`
 * in turn, as the route's conditions and projections are bound to them. Each field is read from its
 * row at once. (JoinedRows nested one per step counted the fields below them on every read: in a
 * 10-way enrichment chain that counting took a tenth of the run's samples.) The slots are shared
 * with the probe loop, which puts each step's row in its slot; read-only.
 */
final class BoundRows(slots: Array[InternalRow], included: Array[Int], widths: Array[Int])
  extends InternalRow {
  private val slotOf: Array[Int] = included.flatMap(s => Array.fill(widths(s))(s))
  private val ordinalOf: Array[Int] = included.flatMap(s => Array.range(0, widths(s)))

  @inline private def row(i: Int): InternalRow = slots(slotOf(i))

  override def numFields: Int = slotOf.length
  override def isNullAt(i: Int): Boolean = row(i).isNullAt(ordinalOf(i))
  override def getBoolean(i: Int): Boolean = row(i).getBoolean(ordinalOf(i))
  override def getByte(i: Int): Byte = row(i).getByte(ordinalOf(i))
  override def getShort(i: Int): Short = row(i).getShort(ordinalOf(i))
  override def getInt(i: Int): Int = row(i).getInt(ordinalOf(i))
  override def getLong(i: Int): Long = row(i).getLong(ordinalOf(i))
  override def getFloat(i: Int): Float = row(i).getFloat(ordinalOf(i))
  override def getDouble(i: Int): Double = row(i).getDouble(ordinalOf(i))
  override def getDecimal(i: Int, precision: Int, scale: Int): Decimal =
    row(i).getDecimal(ordinalOf(i), precision, scale)
  override def getUTF8String(i: Int): UTF8String = row(i).getUTF8String(ordinalOf(i))
  override def getBinary(i: Int): Array[Byte] = row(i).getBinary(ordinalOf(i))
  override def getBinaryView(i: Int): BinaryView = row(i).getBinaryView(ordinalOf(i))
  override def getInterval(i: Int): CalendarInterval = row(i).getInterval(ordinalOf(i))
  override def getTimestampNTZNanos(i: Int): TimestampNanosVal =
    row(i).getTimestampNTZNanos(ordinalOf(i))
  override def getTimestampLTZNanos(i: Int): TimestampNanosVal =
    row(i).getTimestampLTZNanos(ordinalOf(i))
  override def getVariant(i: Int): VariantVal = row(i).getVariant(ordinalOf(i))
  override def getStruct(i: Int, numFields: Int): InternalRow =
    row(i).getStruct(ordinalOf(i), numFields)
  override def getArray(i: Int): ArrayData = row(i).getArray(ordinalOf(i))
  override def getMap(i: Int): MapData = row(i).getMap(ordinalOf(i))
  override def get(i: Int, dataType: DataType): AnyRef = row(i).get(ordinalOf(i), dataType)

  override def setNullAt(i: Int): Unit =
    throw new UnsupportedOperationException("a probe's bound rows are read-only")
  override def update(i: Int, value: Any): Unit =
    throw new UnsupportedOperationException("a probe's bound rows are read-only")

  /** The same fields, each included row copied: it no longer changes with the probe loop. */
  override def copy(): InternalRow = {
    val copied = slots.clone()
    included.foreach(s => copied(s) = slots(s).copy())
    new BoundRows(copied, included, widths)
  }

  override def toString: String = included.map(slots(_)).mkString("[", " | ", "]")
}

object BoundRows {
  /**
   * Per step k of a route whose steps bind as `binds` says (a semi or anti step binds nothing),
   * the rows its conditions read: those bound before it (the route's start in slot 0, step j's
   * row in slot j + 1) and its own candidate row in slot k + 1, over the shared `slots`.
   */
  def perStep(slots: Array[InternalRow], widths: Array[Int],
      binds: Seq[Boolean]): Array[BoundRows] = {
    val boundBefore = binds.zipWithIndex.scanLeft(Array(0)) { case (before, (bind, k)) =>
      if (bind) before :+ (k + 1) else before
    }
    binds.indices.map(k => new BoundRows(slots, boundBefore(k) :+ (k + 1), widths)).toArray
  }
}
