package umjoin.spark.planning

import scala.collection.mutable

import org.apache.spark.sql.catalyst.expressions.{Attribute, AttributeSet, EqualTo, Expression, KnownFloatingPointNormalized, SubqueryExpression}
import org.apache.spark.sql.catalyst.optimizer.NormalizeNaNAndZero
import org.apache.spark.sql.catalyst.plans.{JoinType, LeftAnti, LeftSemi}
import org.apache.spark.sql.catalyst.util.UnsafeRowUtils
import org.apache.spark.sql.types.{ArrayType, DataType, DoubleType, FloatType, MapType, StructType, UserDefinedType}

/**
 * A join key equivalence class: expressions, each over one input, that all conditions of the group
 * make equal. `members` holds (input index, key expression); an input may appear more than once.
 */
final case class KeyClass(members: Seq[(Int, Expression)]) {
  def inputs: Set[Int] = members.map(_._1).toSet
  /** The first expression of `input` in this class: its key for this class. */
  def keyOf(input: Int): Option[Expression] = members.collectFirst { case (`input`, e) => e }
}

/** A condition that is not an equi-join key; it is evaluated once all `inputs` are bound. */
final case class ResidualCondition(condition: Expression, inputs: Set[Int])

/**
 * A LEFT SEMI or LEFT ANTI join inside a group: `input` is its non-preserved side, and
 * `conditions` its condition's conjuncts. Such an input only filters combinations: one passes when
 * some stored row of the input satisfies all conditions (semi) or none does (anti); it binds nothing.
 */
final case class FilterJoin(input: Int, joinType: JoinType, conditions: Seq[Expression])

/**
 * The join graph of a candidate group: which inputs share which key classes, and what else must
 * hold. Built from the inputs' output attributes and all conjuncts of the group's joins and filters,
 * so it serves logical (batch) and physical (streaming) plans alike. `filters` are the inputs that
 * only filter (semi and anti joins, by input): their keys are members of the classes of the keys
 * they are compared with (so they can be co-partitioned and probed by them) but never make two
 * classes one, and their other conditions are residuals that include them.
 */
final case class JoinGraph(numInputs: Int, classes: Seq[KeyClass], residuals: Seq[ResidualCondition],
    filters: Map[Int, JoinType] = Map.empty) {

  /** Inputs whose rows are bound into combinations: all but the filters. */
  def joined: Seq[Int] = (0 until numInputs).filterNot(filters.contains)

  /**
   * Every joined input reachable from every other through key classes (no cartesian step needed),
   * without passing through a filter (which binds no value), and every filter keyed by some class.
   */
  def isConnected: Boolean = {
    val reached = mutable.Set(joined.headOption.getOrElse(0))
    var grew = true
    while (grew) {
      grew = false
      classes.foreach { c =>
        val members = c.inputs -- filters.keySet
        if (members.exists(reached.contains) && !members.subsetOf(reached)) {
          reached ++= members
          grew = true
        }
      }
    }
    reached.size == joined.size && filters.keys.forall(f => classes.exists(_.inputs.contains(f)))
  }

  /** Classes in which both `input` and one of `bound` take part: the key of probing `input` after `bound`. */
  def sharedClasses(input: Int, bound: Set[Int]): Seq[Int] =
    classes.indices.filter(i => classes(i).inputs.contains(input) && classes(i).inputs.exists(bound.contains))
}

object JoinGraph {

  /**
   * The graph from the flat fields a physical UMJoin node keeps it in (expressions directly in the
   * node's fields, so that Catalyst's expression transforms reach them).
   */
  def fromFields(numInputs: Int, classInputs: Seq[Seq[Int]], classKeys: Seq[Seq[Expression]],
      residuals: Seq[Expression], residualInputs: Seq[Seq[Int]], filters: Map[Int, JoinType] = Map.empty): JoinGraph =
    JoinGraph(numInputs,
      classInputs.zip(classKeys).map { case (inputs, keys) => KeyClass(inputs.zip(keys)) },
      residuals.zip(residualInputs).map { case (condition, inputs) => ResidualCondition(condition, inputs.toSet) },
      filters)

  /**
   * Builds the graph, or explains why the group cannot run as one inner multi-way join. The group's
   * result is the conjunction of `conjuncts` over the inputs' rows, projected to `output`; that is
   * only the same as the binary join tree if every condition is deterministic, subquery-free and
   * refers to input attributes only, and `output` comes from the inputs.
   */
  def build(inputOutputs: Seq[Seq[Attribute]], conjuncts: Seq[Expression], output: Seq[Attribute],
      filterJoins: Seq[FilterJoin] = Nil): Either[String, JoinGraph] = {
    val inputSets = inputOutputs.map(AttributeSet(_))
    val allInputs = AttributeSet(inputOutputs.flatten)
    def inputsOf(e: Expression): Set[Int] =
      inputSets.indices.filter(i => e.references.exists(inputSets(i).contains)).toSet

    // Named by their SQL, without expression ids: a streaming query's ids change every micro-batch, its reasons are told once.
    val unsafe = (conjuncts ++ filterJoins.flatMap(_.conditions)).collectFirst {
      case c if !c.deterministic => s"condition ${c.sql} is not deterministic"
      case c if SubqueryExpression.hasSubquery(c) => s"condition ${c.sql} contains a subquery"
      case c if !c.references.subsetOf(allInputs) => s"condition ${c.sql} refers to attributes outside the group's inputs"
    }.orElse(output.collectFirst {
      case a if !allInputs.contains(a) => s"output ${a.sql} is computed inside the join tree, not taken from an input"
    }).orElse(filterJoins.collectFirst {
      case f if f.joinType != LeftSemi && f.joinType != LeftAnti => s"a ${f.joinType.sql} join cannot filter a group"
      case f if output.exists(a => inputSets(f.input).contains(a)) => s"the output takes columns of the ${f.joinType.sql} join's right side"
    })
    unsafe match {
      case Some(reason) => Left(reason)
      case None =>
        val edges = mutable.ArrayBuffer[((Int, Expression), (Int, Expression))]()
        val residuals = mutable.ArrayBuffer[ResidualCondition]()
        conjuncts.foreach {
          case EqualTo(l, r) if isKeyPair(l, r, inputsOf) =>
            edges += (((inputsOf(l).head, normalized(l)), (inputsOf(r).head, normalized(r))))
          case c => residuals += ResidualCondition(c, inputsOf(c))
        }
        val classes = mutable.ArrayBuffer(keyClasses(edges.toSeq): _*)
        filterJoins.foreach { f =>
          val filtered = mutable.Set[Expression]()  // the filter's key expressions (canonical) already in a class
          f.conditions.foreach { c =>
            keyOfFilter(c, f.input, inputsOf) match {
              case Some((joined, key)) if !filtered.contains(key.canonicalized) =>
                filtered += key.canonicalized
                val (member, other) = ((f.input, normalized(key)), (joined._1, normalized(joined._2)))
                classes.indexWhere(_.members.exists { case (i, e) => i == other._1 && e.canonicalized == other._2.canonicalized }) match {
                  case -1 => classes += KeyClass(Seq(other, member))
                  case c => classes(c) = KeyClass(classes(c).members :+ member)
                }
              // Any other conjunct, even one over the preserved side alone, is checked with the filter's row:
              // an anti join keeps a combination for which it is false.
              case _ => residuals += ResidualCondition(c, inputsOf(c) + f.input)
            }
          }
        }
        Right(JoinGraph(inputOutputs.size, classes.toSeq, residuals.toSeq, filterJoins.map(f => f.input -> f.joinType).toMap))
    }
  }

  /** `(joined input, its expression)` and the filter's key when `c` is an equi-join key between the filter and one joined input. */
  private def keyOfFilter(c: Expression, filter: Int, inputsOf: Expression => Set[Int]): Option[((Int, Expression), Expression)] = c match {
    case EqualTo(l, r) if isKeyPair(l, r, inputsOf) =>
      if (inputsOf(r) == Set(filter)) Some(((inputsOf(l).head, l), r))
      else if (inputsOf(l) == Set(filter)) Some(((inputsOf(r).head, r), l))
      else None
    case _ => None
  }

  /**
   * `l = r` is an equi-join key if each side is over exactly one input, the two inputs differ, and
   * equal values have equal bytes once normalised (not so for non-binary collations, nor for
   * floating point numbers nested in structs or arrays, which stay conditions).
   */
  private def isKeyPair(l: Expression, r: Expression, inputsOf: Expression => Set[Int]): Boolean = {
    val (li, ri) = (inputsOf(l), inputsOf(r))
    li.size == 1 && ri.size == 1 && li != ri && l.dataType == r.dataType &&
      UnsafeRowUtils.isBinaryStable(l.dataType) && (isFloating(l.dataType) || !containsFloating(l.dataType))
  }

  private def isFloating(t: DataType): Boolean = t == FloatType || t == DoubleType

  private def containsFloating(t: DataType): Boolean = t match {
    case FloatType | DoubleType => true
    case s: StructType => s.fields.exists(f => containsFloating(f.dataType))
    case a: ArrayType => containsFloating(a.elementType)
    case m: MapType => containsFloating(m.keyType) || containsFloating(m.valueType)
    case u: UserDefinedType[_] => containsFloating(u.sqlType)
    case _ => false
  }

  /** SQL has -0.0 = 0.0 and NaN = NaN; normalising floating point keys makes their bytes agree too. */
  private def normalized(key: Expression): Expression = key match {
    case _: KnownFloatingPointNormalized => key
    case _ if isFloating(key.dataType) => KnownFloatingPointNormalized(NormalizeNaNAndZero(key))
    case _ => key
  }

  /** Union-find over (input, canonical key expression); each connected set is one key class. */
  private def keyClasses(edges: Seq[((Int, Expression), (Int, Expression))]): Seq[KeyClass] = {
    val nodes = mutable.LinkedHashMap[(Int, Expression), (Int, Expression)]()  // canonical -> original
    edges.foreach { case (a, b) =>
      Seq(a, b).foreach(n => nodes.getOrElseUpdate((n._1, n._2.canonicalized), n))
    }
    val keys = nodes.keys.toIndexedSeq
    val parent = Array.tabulate(keys.size)(identity)
    def find(i: Int): Int = if (parent(i) == i) i else { parent(i) = find(parent(i)); parent(i) }
    val index = keys.zipWithIndex.toMap
    edges.foreach { case (a, b) =>
      parent(find(index((a._1, a._2.canonicalized)))) = find(index((b._1, b._2.canonicalized)))
    }
    keys.indices.groupBy(find).toSeq.sortBy(_._2.min).map { case (_, members) =>
      KeyClass(members.sorted.map(i => nodes(keys(i))))
    }
  }
}
