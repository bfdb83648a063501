package umjoin.spark.streaming

/**
 * What a row shipped between the stages of a micro-batch is (see [[StageTask]]). On the wire a
 * shipped row is an envelope: an integer tag ([[Shipped.Tags]]), then the row's bytes.
 */
private[streaming] sealed trait Shipped

private[streaming] object Shipped {

  /** A partial combination of a route, going on in the partition it is sent to. */
  sealed trait Partial extends Shipped {
    /** The input whose route the combination follows. */
    def start: Int
  }

  /** A partial combination of the route that starts from stream `start`'s new rows. */
  final case class NewRows(start: Int) extends Partial

  /**
   * A partial combination of the rescan of stream `start`'s stored rows, which finds the
   * combinations an outer join pads now (see [[OuterPadding]]); it takes the steps of `start`'s
   * route.
   */
  final case class Rescan(start: Int) extends Partial

  /** A complete result row (it only travels to the last stage). */
  case object Result extends Shipped

  /** A combination of a semi join's preserved inputs, waiting for a row of its input `semi`. */
  sealed trait Waiting extends Shipped {
    def semi: Int
  }

  /** No row of input `semi` matched it yet: it waits in its partition for the stage settling it. */
  final case class Unmatched(semi: Int) extends Waiting

  /**
   * The semi joins below input `semi`'s let it through: it is tried on that join's rows in the
   * stage settling it.
   */
  final case class PassedOn(semi: Int) extends Waiting

  /**
   * The tags of a group of `inputs` inputs: NewRows(s) is s, Rescan(s) is inputs + s, Result is -1,
   * Unmatched(o) is -2 - 2o and PassedOn(o) is -3 - 2o. Reading a tag allocates nothing.
   */
  final class Tags(inputs: Int) {
    private val partials: Array[Partial] = Array.tabulate(2 * inputs) { t =>
      if (t < inputs) NewRows(t) else Rescan(t - inputs)
    }
    private val waiting: Array[Waiting] = Array.tabulate(2 * inputs) { t =>
      if (t % 2 == 0) Unmatched(t / 2) else PassedOn(t / 2)
    }

    def tag(shipped: Shipped): Int = shipped match {
      case NewRows(start) => start
      case Rescan(start) => inputs + start
      case Result => -1
      case Unmatched(semi) => -2 - 2 * semi
      case PassedOn(semi) => -3 - 2 * semi
    }

    def of(tag: Int): Shipped =
      if (tag >= 0) partials(tag) else if (tag == -1) Result else waiting(-2 - tag)

    def isPartial(tag: Int): Boolean = of(tag).isInstanceOf[Partial]
  }
}
