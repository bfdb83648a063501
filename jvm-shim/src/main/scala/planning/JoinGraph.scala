package umjoin.spark.planning

import scala.collection.mutable

import org.apache.spark.sql.catalyst.expressions.{Attribute, AttributeSet, EqualTo, Expression, KnownFloatingPointNormalized, SubqueryExpression}
import org.apache.spark.sql.catalyst.optimizer.NormalizeNaNAndZero
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
 * The join graph of a candidate group: which inputs share which key classes, and what else must
 * hold. Built from the inputs' output attributes and all conjuncts of the group's joins and filters,
 * so it serves logical (batch) and physical (streaming) plans alike.
 */
final case class JoinGraph(numInputs: Int, classes: Seq[KeyClass], residuals: Seq[ResidualCondition]) {

  /** Every input reachable from every other through key classes (no cartesian step needed). */
  def isConnected: Boolean = {
    val reached = mutable.Set(0)
    var grew = true
    while (grew) {
      grew = false
      classes.foreach { c =>
        if (c.inputs.exists(reached.contains) && !c.inputs.subsetOf(reached)) {
          reached ++= c.inputs
          grew = true
        }
      }
    }
    reached.size == numInputs
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
      residuals: Seq[Expression], residualInputs: Seq[Seq[Int]]): JoinGraph =
    JoinGraph(numInputs,
      classInputs.zip(classKeys).map { case (inputs, keys) => KeyClass(inputs.zip(keys)) },
      residuals.zip(residualInputs).map { case (condition, inputs) => ResidualCondition(condition, inputs.toSet) })

  /**
   * Builds the graph, or explains why the group cannot run as one inner multi-way join. The group's
   * result is the conjunction of `conjuncts` over the inputs' rows, projected to `output`; that is
   * only the same as the binary join tree if every condition is deterministic, subquery-free and
   * refers to input attributes only, and `output` comes from the inputs.
   */
  def build(inputOutputs: Seq[Seq[Attribute]], conjuncts: Seq[Expression], output: Seq[Attribute]): Either[String, JoinGraph] = {
    val inputSets = inputOutputs.map(AttributeSet(_))
    val allInputs = AttributeSet(inputOutputs.flatten)
    def inputsOf(e: Expression): Set[Int] =
      inputSets.indices.filter(i => e.references.exists(inputSets(i).contains)).toSet

    // Named by their SQL, without expression ids: a streaming query's ids change every micro-batch, its reasons are told once.
    val unsafe = conjuncts.collectFirst {
      case c if !c.deterministic => s"condition ${c.sql} is not deterministic"
      case c if SubqueryExpression.hasSubquery(c) => s"condition ${c.sql} contains a subquery"
      case c if !c.references.subsetOf(allInputs) => s"condition ${c.sql} refers to attributes outside the group's inputs"
    }.orElse(output.collectFirst {
      case a if !allInputs.contains(a) => s"output ${a.sql} is computed inside the join tree, not taken from an input"
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
        Right(JoinGraph(inputOutputs.size, keyClasses(edges.toSeq), residuals.toSeq))
    }
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
