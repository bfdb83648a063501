package umjoin.spark.core

import scala.collection.mutable

import org.apache.spark.sql.catalyst.expressions.{Attribute, AttributeSet, Coalesce, EqualNullSafe,
  EqualTo, Expression, IsNull, KnownFloatingPointNormalized, Literal, SubqueryExpression}
import org.apache.spark.sql.catalyst.optimizer.NormalizeNaNAndZero
import org.apache.spark.sql.catalyst.plans.{Inner, JoinType, LeftAnti, LeftOuter, LeftSemi}
import org.apache.spark.sql.catalyst.util.UnsafeRowUtils
import org.apache.spark.sql.types.{ArrayType, DataType, DoubleType, FloatType, MapType, StructType,
  UserDefinedType}

import umjoin.spark.core.probe.StepRule

/**
 * A join key equivalence class: expressions, each over one input, that all conditions of the group
 * make equal. `members` holds (input index, key expression); an input may appear more than once.
 */
final case class KeyClass(members: Seq[(Int, Expression)]) {
  def inputs: Set[Int] = members.map(_._1).toSet
  /** The first expression of `input` in this class: its key for this class. */
  def keyOf(input: Int): Option[Expression] = members.collectFirst { case (`input`, e) => e }
}

/**
 * A condition that is not an equi-join key; it is evaluated once all `inputs` are bound. `outer`:
 * the outer input whose ON clause it belongs to, so that it decides which of that input's rows
 * match (a combination none matches goes on with NULLs) instead of dropping combinations.
 */
final case class ResidualCondition(condition: Expression, inputs: Set[Int],
    outer: Option[Int] = None)

/**
 * A LEFT SEMI or LEFT ANTI join inside a group: `input` is its non-preserved side, and
 * `conditions` its condition's conjuncts. Such an input only filters combinations: one passes when
 * some stored row of the input satisfies all conditions (semi) or none does (anti); it binds
 * nothing.
 */
final case class FilterJoin(input: Int, joinType: JoinType, conditions: Seq[Expression])

/**
 * A LEFT OUTER join inside a group (a RIGHT OUTER one with its sides swapped): `input` is its
 * non-preserved side, `conditions` its ON clause's conjuncts. A combination of the preserved
 * side's inputs goes on with each row of `input` satisfying them all, or once with NULLs for
 * `input`'s columns when none does.
 */
final case class OuterJoin(input: Int, conditions: Seq[Expression])

/**
 * The join graph of a candidate group: which inputs share which key classes, and what else must
 * hold. Built from the inputs' output attributes and all conjuncts of the group's joins and
 * filters, so it serves logical (batch) and physical (streaming) plans alike. `filters` are the
 * inputs that only filter (semi and anti joins, by input): their keys are members of the classes of
 * the keys they are compared with (so they can be co-partitioned and probed by them) but never make
 * two classes one, and their other conditions are residuals that include them.
 *
 * `outer` maps the non-preserved input of each outer join to the classes of its ON clause's equi
 * keys. A NULL-padded row breaks what a class means (its members equal), so every equality with
 * an outer input's expression is a class of its own, of exactly that pair, never merged with
 * another: the value it is probed by is then always the expression of the input bound first (for
 * an ON key, the preserved side's), NULL where that input was padded.
 */
final case class JoinGraph(numInputs: Int,
    classes: Seq[KeyClass], residuals: Seq[ResidualCondition],
    filters: Map[Int, JoinType] = Map.empty, outer: Map[Int, Seq[Int]] = Map.empty) {

  /** Inputs whose rows are bound into combinations: all but the filters. */
  def joined: Seq[Int] = (0 until numInputs).filterNot(filters.contains)

  /**
   * How input i's step treats a combination: inner, semi or anti (a filter), outer (an outer join's
   * non-preserved side).
   */
  def stepRule(i: Int): StepRule =
    StepRule.of(filters.getOrElse(i, if (outer.contains(i)) LeftOuter else Inner))

  /**
   * Input i's key expressions a NULL in which keeps its row out of every result: all its keys but
   * those of another input's outer join, which keeps a row of its preserved side whatever its key
   * (padded with NULLs where nothing matches it).
   */
  def keysRejectingNull(i: Int): Seq[Expression] = {
    val preservedSide = outer.collect { case (o, onClasses) if o != i => onClasses }.flatten.toSet
    classes.indices.filterNot(preservedSide.contains)
      .flatMap(c => classes(c).members.collect { case (`i`, e) => e })
  }

  /** The inputs an outer input's ON clause reads besides it: all bound before it is probed. */
  def onInputs(outerInput: Int): Set[Int] =
    (outer(outerInput).flatMap(c => classes(c).inputs) ++
      residuals.filter(_.outer.contains(outerInput)).flatMap(_.inputs)).toSet - outerInput

  /**
   * Every joined input reachable from every other through key classes (no cartesian step needed),
   * without passing through a filter (which binds no value), and every filter keyed by some class.
   */
  def isConnected: Boolean =
    connects(joined.toSet) && filters.keys.forall(f => classes.exists(_.inputs.contains(f)))

  /**
   * Whether every one of `inputs` is reachable from every other through key classes, passing
   * through none but them.
   */
  def connects(inputs: Set[Int]): Boolean = {
    val reached = mutable.Set(inputs.headOption.getOrElse(0))
    var grew = true
    while (grew) {
      grew = false
      classes.foreach { c =>
        val members = c.inputs intersect inputs
        if (members.exists(reached.contains) && !members.subsetOf(reached)) {
          reached ++= members
          grew = true
        }
      }
    }
    reached.size == inputs.size
  }

  /**
   * The graph as a physical UMJoin node keeps it: its shape, and its expressions (the classes'
   * keys, then the residual conditions) in a field of their own, where Catalyst's expression
   * transforms (canonicalization, exchange reuse, subquery planning) reach them.
   */
  def split: (GraphShape, Seq[Expression]) =
    (GraphShape(numInputs, classes.map(_.members.map(_._1)),
      residuals.map(_.inputs.toSeq.sorted), residuals.map(_.outer), filters, outer),
      classes.flatMap(_.members.map(_._2)) ++ residuals.map(_.condition))

  /**
   * Classes in which both `input` and one of `bound` take part: the key of probing `input` after
   * `bound`.
   */
  def sharedClasses(input: Int, bound: Set[Int]): Seq[Int] =
    classes.indices.filter(i => classes(i).inputs.contains(input) &&
      classes(i).inputs.exists(bound.contains))
}

/** A [[JoinGraph]] without its expressions (see [[JoinGraph.split]]). */
final case class GraphShape(numInputs: Int, classInputs: Seq[Seq[Int]],
    residualInputs: Seq[Seq[Int]], residualOuter: Seq[Option[Int]], filters: Map[Int, JoinType],
    outer: Map[Int, Seq[Int]]) {

  /** The graph again, from the expressions `split` gave (possibly transformed since). */
  def withExpressions(expressions: Seq[Expression]): JoinGraph = {
    val keyCount = classInputs.map(_.size).sum
    require(expressions.size == keyCount + residualInputs.size,
      s"a join graph of this shape has ${keyCount + residualInputs.size} expressions")
    val keys = classInputs.scanLeft(0)(_ + _.size).zip(classInputs)
      .map { case (from, inputs) => expressions.slice(from, from + inputs.size) }
    JoinGraph(numInputs,
      classInputs.zip(keys).map { case (inputs, exprs) => KeyClass(inputs.zip(exprs)) },
      residualInputs.indices.map(k =>
        ResidualCondition(expressions(keyCount + k), residualInputs(k).toSet, residualOuter(k))),
      filters, outer)
  }
}

object JoinGraph {

  /**
   * Builds the graph, or explains why the group cannot run as one inner multi-way join. The group's
   * result is the conjunction of `conjuncts` over the inputs' rows, projected to `output`; that is
   * only the same as the binary join tree if every condition is deterministic, subquery-free and
   * refers to input attributes only, and `output` comes from the inputs. With
   * `oneKeyPerNonInnerJoin`, an outer or filter join's first equi-join key between its sides is its
   * only key class, and any further equality there one more condition of its ON clause (a streaming
   * UMJoin finds the match of a waiting combination by one key).
   */
  def build(inputOutputs: Seq[Seq[Attribute]], conjuncts: Seq[Expression], output: Seq[Attribute],
      filterJoins: Seq[FilterJoin] = Nil, outerJoins: Seq[OuterJoin] = Nil,
      oneKeyPerNonInnerJoin: Boolean = false): Either[String, JoinGraph] = {
    val inputSets = inputOutputs.map(AttributeSet(_))
    val allInputs = AttributeSet(inputOutputs.flatten)
    def inputsOf(e: Expression): Set[Int] =
      inputSets.indices.filter(i => e.references.exists(inputSets(i).contains)).toSet

    // Named by their SQL, without expression ids: a streaming query's ids change every micro-batch,
    // its reasons are told once.
    val unsafe = (conjuncts ++ filterJoins.flatMap(_.conditions) ++
      outerJoins.flatMap(_.conditions)).collectFirst {
        case c if !c.deterministic => s"condition ${c.sql} is not deterministic"
        case c if SubqueryExpression.hasSubquery(c) => s"condition ${c.sql} contains a subquery"
        case c if !c.references.subsetOf(allInputs) =>
          s"condition ${c.sql} refers to attributes outside the group's inputs"
      }.orElse(output.collectFirst {
        case a if !allInputs.contains(a) =>
          s"output ${a.sql} is computed inside the join tree, not taken from an input"
      }).orElse(filterJoins.collectFirst {
        case f if f.joinType != LeftSemi && f.joinType != LeftAnti =>
          s"a ${f.joinType.sql} join cannot filter a group"
        case f if output.exists(a => inputSets(f.input).contains(a)) =>
          s"the output takes columns of the ${f.joinType.sql} join's right side"
      })
    unsafe match {
      case Some(reason) => Left(reason)
      case None =>
        val outerInputs = outerJoins.map(_.input).toSet
        val edges = mutable.ArrayBuffer[((Int, Expression), (Int, Expression))]()
        // equalities with an outer input's expression: classes of their own
        val pairs = mutable.ArrayBuffer[KeyClass]()
        val residuals = mutable.ArrayBuffer[ResidualCondition]()
        conjuncts.flatMap(nullSafeAsKeys(_, inputsOf)).foreach {
          case EqualTo(l, r) if isKeyPair(l, r, inputsOf) =>
            val (a, b) = ((inputsOf(l).head, normalized(l)), (inputsOf(r).head, normalized(r)))
            if (outerInputs.contains(a._1) || outerInputs.contains(b._1))
              pairs += KeyClass(Seq(a, b)) else edges += ((a, b))
          case c => residuals += ResidualCondition(c, inputsOf(c))
        }
        val classes = mutable.ArrayBuffer(keyClasses(edges.toSeq) ++ pairs: _*)
        // An ON clause's key between the outer input and another input is a class of that pair,
        // probed by the other input's expression; every other conjunct decides with the outer
        // input's row which of its rows match.
        val onClasses = outerJoins.map { o =>
          var keyed = false
          o.input -> o.conditions.flatMap {
            case EqualTo(l, r) if isKeyPair(l, r, inputsOf) &&
                (inputsOf(l) == Set(o.input)) != (inputsOf(r) == Set(o.input)) &&
                !(oneKeyPerNonInnerJoin && keyed) =>
              keyed = true
              val (mine, other) = if (inputsOf(l) == Set(o.input)) (l, r) else (r, l)
              classes += KeyClass(Seq((inputsOf(other).head, normalized(other)),
                (o.input, normalized(mine))))
              Some(classes.size - 1)
            case c =>
              residuals += ResidualCondition(c, inputsOf(c) + o.input, Some(o.input))
              None
          }
        }.toMap
        filterJoins.foreach { f =>
          // the filter's key expressions (canonical) already in a class
          val filtered = mutable.Set[Expression]()
          f.conditions.foreach { c =>
            keyOfFilter(c, f.input, inputsOf) match {
              case Some((joined, key)) if !filtered.contains(key.canonicalized) &&
                  !(oneKeyPerNonInnerJoin && filtered.nonEmpty) =>
                filtered += key.canonicalized
                val (member, other) =
                  ((f.input, normalized(key)), (joined._1, normalized(joined._2)))
                val shared = (c: KeyClass) => !c.inputs.exists(outerInputs.contains) &&
                  c.members.exists { case (i, e) =>
                    i == other._1 && e.canonicalized == other._2.canonicalized
                  }
                classes.indexWhere(shared) match {
                  case -1 => classes += KeyClass(Seq(other, member))
                  case c => classes(c) = KeyClass(classes(c).members :+ member)
                }
              // Any other conjunct, even one over the preserved side alone, is checked with the
              // filter's row: an anti join keeps a combination for which it is false.
              case _ => residuals += ResidualCondition(c, inputsOf(c) + f.input)
            }
          }
        }
        onClasses.collectFirst { case (input, Nil) => input } match {
          case Some(input) =>
            Left(s"the outer join of input #$input has no equi-join key between its two sides")
          case None => Right(JoinGraph(inputOutputs.size, classes.toSeq, residuals.toSeq,
            filterJoins.map(f => f.input -> f.joinType).toMap, onClasses))
        }
    }
  }

  /**
   * `l <=> r` (NULL matches NULL) between two inputs as two equalities of values never NULL, as
   * Spark's own equi-joins take it: `coalesce(l, default) = coalesce(r, default)` and `isnull(l) =
   * isnull(r)`.
   */
  private def nullSafeAsKeys(c: Expression,
      inputsOf: Expression => Set[Int]): Seq[Expression] = c match {
    case EqualNullSafe(l, r) if isKeyPair(l, r, inputsOf) =>
      Seq(EqualTo(Coalesce(Seq(l, Literal.default(l.dataType))),
        Coalesce(Seq(r, Literal.default(r.dataType)))),
        EqualTo(IsNull(l), IsNull(r)))
    case other => Seq(other)
  }

  /**
   * `(joined input, its expression)` and the filter's key when `c` is an equi-join key between the
   * filter and one joined input.
   */
  private def keyOfFilter(c: Expression, filter: Int,
      inputsOf: Expression => Set[Int]): Option[((Int, Expression), Expression)] = c match {
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
      UnsafeRowUtils.isBinaryStable(l.dataType) &&
      (isFloating(l.dataType) || !containsFloating(l.dataType))
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

  /**
   * SQL has -0.0 = 0.0 and NaN = NaN; normalising floating point keys makes their bytes agree too.
   */
  private def normalized(key: Expression): Expression = key match {
    case _: KnownFloatingPointNormalized => key
    case _ if isFloating(key.dataType) => KnownFloatingPointNormalized(NormalizeNaNAndZero(key))
    case _ => key
  }

  /** Union-find over (input, canonical key expression); each connected set is one key class. */
  private def keyClasses(edges: Seq[((Int, Expression), (Int, Expression))]): Seq[KeyClass] = {
    // canonical -> original
    val nodes = mutable.LinkedHashMap[(Int, Expression), (Int, Expression)]()
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
