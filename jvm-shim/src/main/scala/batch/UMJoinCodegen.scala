package umjoin.spark.batch

import org.apache.spark.rdd.RDD
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{And, Attribute, AttributeSet, BindReferences,
  BoundReference, Expression}
import org.apache.spark.sql.catalyst.expressions.codegen.{CodegenContext, ExprCode,
  GenerateUnsafeProjection}
import org.apache.spark.sql.execution.CodegenSupport
import org.apache.spark.sql.types.LongType

import umjoin.spark.core.ZippedInputsRDD
import umjoin.spark.core.probe.{InputMetrics, StepRule}
import umjoin.spark.core.store.JoinStore

/**
 * A batch UMJoin's generated code, inside Spark's whole-stage code generation: the streamed input's
 * rows flow from its own generated code through one loop nest, a loop per step of the fixed route,
 * each step doing what its [[StepRule]] says (as the interpreted loop, `ProbeCore`, does). An
 * adaptive route changes at runtime, so it runs interpreted; so does Spark's fallback (codegen off,
 * or code that fails to compile), through `doExecute`.
 */
trait UMJoinCodegen extends CodegenSupport { self: UMJoinExec =>

  override def supportCodegen: Boolean = !probeOrder.adaptive

  // A streamed row may give several output rows before the parent's buffer is read.
  override def needCopyResult: Boolean = true

  // doConsume evaluates each streamed column where a key, a condition or the output first reads it:
  // with Spark's default (every referenced column) all of them would be read for every streamed
  // row, also for rows the first probe drops (TPC-H Q8: decimals of 6 million lineitem rows, 17 %
  // of the query's samples).
  override def usedInputs: AttributeSet = AttributeSet.empty

  /**
   * The streamed side's input RDDs, the first one zipped with the stored inputs' partitions: a
   * task builds its stores from them before the generated code starts, and finds them in
   * `inputs[0]`, a [[StoredInputs]] (whose rows are that RDD's, untouched: possibly columnar
   * batches, hence the casts).
   */
  override def inputRDDs(): Seq[RDD[InternalRow]] = {
    val streamedRDDs = children(streamed).asInstanceOf[CodegenSupport].inputRDDs()
    val partitioned = children.indices.filter(i => i != streamed && !broadcast(i))
    val (storesOf, probed, planId) =
      (taskStores, initialPlan.steps.map(s => (s.input, s.index)), id)
    // An empty store filters nothing at an anti join, and pads every combination at an outer join.
    val emptyEndsAll = initialPlan.steps.map(_.rule.emptyStoreEndsAll).toArray
    val zipped = new ZippedInputsRDD[Any, Any]((streamedRDDs.head +:
      partitioned.map(children(_).execute())).map(_.asInstanceOf[RDD[Any]]), {
        (context, iterators) =>
          val indexOf = storesOf(context,
            i => iterators(1 + partitioned.indexOf(i)).asInstanceOf[Iterator[InternalRow]])
          new StoredInputs(planId, probed.map(indexOf).toArray, emptyEndsAll, iterators(0))
      })
    zipped.asInstanceOf[RDD[InternalRow]] +: streamedRDDs.tail
  }

  // The generated code's fields holding the task's stores (per route step) and whether each has
  // unique keys: named by doProduce, used by doConsume.
  @transient private var storeFields: IndexedSeq[String] = IndexedSeq.empty
  @transient private var uniqueFields: IndexedSeq[String] = IndexedSeq.empty

  override def doProduce(ctx: CodegenContext): String = {
    val steps = initialPlan.steps
    storeFields = steps.map(s => ctx.addMutableState(classOf[JoinStore].getName, s"store${s.input}",
      forceInline = true)).toIndexedSeq
    uniqueFields = steps.map(s =>
      ctx.addMutableState("boolean", s"unique${s.input}", forceInline = true)).toIndexedSeq
    val (ready, anyEmpty) = (ctx.addMutableState("boolean", "storesReady", forceInline = true),
      ctx.addMutableState("boolean", "anyStoreEmpty", forceInline = true))
    val stored = ctx.freshName("stored")
    val name = classOf[StoredInputs].getName
    // The plan id as a reference, not a literal: generated source that is the same for every
    // planning of a query is compiled once and then found in Spark's code cache.
    val planId = ctx.addReferenceObj("umjoinPlanId", Integer.valueOf(id), "java.lang.Integer")
    // Read when this UMJoin's rows start, not when the task starts: under a generated Union,
    // `inputs[0]` is another child's input in the partitions of that child.
    val bind = steps.indices.map(k => s"${storeFields(k)} = $stored.step($k);\n${uniqueFields(k)}" +
      s" = ${storeFields(k)}.keysAreUnique();")
    // A store without rows: no combination can complete, so the streamed rows are not even read.
    s"""
       |if (!$ready) {
       |  $name $stored = (($name) inputs[0]).of($planId.intValue());
       |  $anyEmpty = $stored.anyEmpty();
       |  ${bind.mkString("\n")}
       |  $ready = true;
       |}
       |if (!$anyEmpty) {
       |  ${children(streamed).asInstanceOf[CodegenSupport].produce(ctx, this)}
       |}
     """.stripMargin
  }

  override def doConsume(ctx: CodegenContext, input: Seq[ExprCode], row: ExprCode): String = {
    val plan = initialPlan
    val (storeTerms, uniqueTerms) = (storeFields, uniqueFields)

    /**
     * Code checking `conditions` on the rows bound (attributes `attrs`, variables `vars`); runs
     * `body` if they hold.
     */
    def where(conditions: Seq[Expression], attrs: Seq[Attribute], vars: Seq[ExprCode],
        body: => String): String =
      conditions.reduceOption(And) match {
        case None => body
        case Some(condition) =>
          val evaluated = evaluateRequiredVariables(attrs, vars, condition.references)
          ctx.currentVars = vars
          ctx.INPUT_ROW = null
          val ev = BindReferences.bindReference(condition, attrs).genCode(ctx)
          s"""
             |$evaluated
             |${ev.code}
             |if (!${ev.isNull} && ${ev.value}) {
             |  $body
             |}
           """.stripMargin
      }

    /**
     * Code for steps k.. of the route, the route's first k + 1 inputs being bound (`attrs`,
     * `vars`).
     */
    def steps(k: Int, attrs: Seq[Attribute], vars: Seq[ExprCode]): String =
      if (k == plan.steps.size) {
        val outputVars = output.map(a => vars(attrs.indexWhere(_.exprId == a.exprId)))
        s"""
           |${metricTerm(ctx, "numOutputRows")}.add(1);
           |${consume(ctx, outputVars)}
         """.stripMargin
      } else {
        val step = plan.steps(k)
        val input = step.input
        val probeKeys = UMJoinExec.hashable(step.probeKeys)
        // A filter's steps go on after its loop: the bound rows' columns its conditions read are
        // evaluated before it.
        val used = probeKeys.flatMap(_.references) ++
          (if (step.rule.binds) Nil else step.conditions.flatMap(_.references))
        val keyInputs = evaluateRequiredVariables(attrs, vars, AttributeSet(used))
        ctx.currentVars = vars
        ctx.INPUT_ROW = null
        // A key of one LongType column is looked up by its value (`getLong`), as Spark's hash joins
        // look up a long key: no key row is written and checked for NULLs per probe.
        val longKey = probeKeys.size == 1 && probeKeys.head.dataType == LongType
        val boundKeys = BindReferences.bindReferences(probeKeys, attrs)
        val key =
          if (longKey) boundKeys.head.genCode(ctx)
          else GenerateUnsafeProjection.createCode(ctx, boundKeys)
        val (keyIsNull, getOne, get) =
          if (longKey) (key.isNull.toString, "getOneLong", "getLong")
          else (s"${key.value}.anyNull()", "getOne", "get")
        val (matches, one, found, storedRow) = (ctx.freshName("matches"), ctx.freshName("one"),
          ctx.freshName("found"), ctx.freshName("storedRow"))
        ctx.INPUT_ROW = storedRow
        ctx.currentVars = null
        val storedAttrs = boundOutputs(step.input)
        val storedVars = storedAttrs.zipWithIndex.map { case (a, i) =>
          BoundReference(i, a.dataType, a.nullable).genCode(ctx)
        }
        val (nextAttrs, nextVars) = (attrs ++ storedAttrs, vars ++ storedVars)
        // An outer step's combinations go on from two places, each matching row and the NULL row:
        // the bound rows' columns are evaluated before both, and the rest of the route is generated
        // for each.
        val anyMatch = ctx.freshName("anyMatch")
        val (evaluatedForBoth, outerDeclarations) =
          if (step.rule.noMatch == StepRule.Padded)
            (evaluateVariables(vars), s"boolean $anyMatch = false;") else ("", "")
        def goesOn(rowVars: Seq[ExprCode]): String = s"""
             |$found++;
             |${steps(k + 1, attrs ++ storedAttrs, vars ++ rowVars)}
           """.stripMargin
        // What a match and its absence do, as the step's rule says (the interpreted loop follows
        // the same rule).
        val rule = step.rule
        val matchedCount = s"${metricTerm(ctx, InputMetrics.matches(input))}.add(1);"
        // A step that stops at its first match only notes it; the combination goes on (or not)
        // after the loop.
        def matched: String =
          if (rule.firstMatchOnly) s"$matchedCount\n$found++;\nbreak;"
          else if (step.firstMatchDecides) s"$matchedCount\n$anyMatch = true;\nbreak;"
          else s"""
             |$matchedCount
             |${if (rule.noMatch == StepRule.Padded) s"$anyMatch = true;" else ""}
             |${where(step.postConditions, nextAttrs, nextVars, goesOn(storedVars))}
           """.stripMargin
        val earlyStop = s"${metricTerm(ctx, InputMetrics.earlyStops(input))}.add(1);"
        val goOn =
          if (rule.firstMatchOnly) {
            val goesOnIf = if (rule.goesOnMatched) s"$found > 0L" else s"$found == 0L"
            s"if ($goesOnIf) {\n${steps(k + 1, attrs, vars)}\n} else $earlyStop"
          } else if (rule.noMatch == StepRule.Padded) {
            val nulls = storedAttrs.map(a => ExprCode.forNullValue(a.dataType))
            s"""
               |if (!$anyMatch) {
               |  ${metricTerm(ctx, InputMetrics.nullPadded(input))}.add(1);
               |  ${where(step.postConditions, attrs ++ storedAttrs, vars ++ nulls, goesOn(nulls))}
               |}
               |if ($found == 0L) $earlyStop
             """.stripMargin
          } else s"if ($found == 0L) $earlyStop"
        // Rows of the store stay valid until its next lookup, so a match is used before the next is
        // read.
        s"""
           |${metricTerm(ctx, InputMetrics.probes(input))}.add(1);
           |$keyInputs
           |$evaluatedForBoth
           |${key.code}
           |long $found = 0L;
           |$outerDeclarations
           |if (!$keyIsNull) {
           |  scala.collection.Iterator $matches = null;
           |  InternalRow $one = null;
           |  if (${uniqueTerms(k)}) $one = ${storeTerms(k)}.$getOne(${key.value});
           |  else $matches = ${storeTerms(k)}.$get(${key.value});
           |  while (true) {
           |    InternalRow $storedRow;
           |    if ($matches == null) {
           |      if ($one == null) break;
           |      $storedRow = $one;
           |      $one = null;
           |    } else {
           |      if (!$matches.hasNext()) break;
           |      $storedRow = (InternalRow) $matches.next();
           |    }
           |    ${where(step.conditions, nextAttrs, nextVars, matched)}
           |  }
           |}
           |$goOn
         """.stripMargin
      }

    val streamedAttrs = children(streamed).output
    s"""
       |${metricTerm(ctx, InputMetrics.rowsIn(streamed))}.add(1);
       |${where(plan.startConditions, streamedAttrs, input, steps(0, streamedAttrs, input))}
     """.stripMargin
  }
}

/**
 * What the generated code of a UMJoin task reads as `inputs[0]`: the streamed side's first input,
 * as it comes, with the task's stores in route order (`step(k)` is probed at step k). A UMJoin
 * streaming another one in the same generated code wraps that one's: each finds its own by plan id.
 */
final class StoredInputs(planId: Int, stores: Array[JoinStore], emptyEndsAll: Array[Boolean],
    rows: Iterator[Any]) extends Iterator[Any] {
  def of(id: Int): StoredInputs =
    if (id == planId) this
    else rows match {
      case inner: StoredInputs => inner.of(id)
      case _ => throw new IllegalStateException(s"no stores of UMJoin plan $id in this task")
    }
  def step(k: Int): JoinStore = stores(k)
  /** Whether a store without rows means no combination completes (any but an anti join's). */
  def anyEmpty: Boolean = stores.indices.exists(k => emptyEndsAll(k) && stores(k).isEmpty)
  override def hasNext: Boolean = rows.hasNext
  override def next(): Any = rows.next()
}
