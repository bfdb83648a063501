package umjoin.spark.core

import org.apache.spark.sql.catalyst.trees.TreeNode

import umjoin.spark.core.tsc.{MemberRole, MultiJoinGroup, TwoStepConvert}

/**
 * A place where a group can be split: `node` (a member join, or the pass-through members right
 * above it) leaves the group with the group inputs `inputsBelow` (indices into `group.inputs`).
 */
final case class Cut[T](node: T, inputsBelow: Set[Int])

/**
 * Decides whether the node being planned is the root of a group that runs as one UMJoin. When the
 * whole group cannot (its inputs cannot be distributed, or are not all connected by keys), the
 * group is split at one of its joins and tried again: the split-off subtree becomes an input of the
 * rest and forms its own groups when it is planned in turn. A plan that works may still ask for a
 * cut (`preferredCut`), e.g. to run some joins before a shuffle. A group converts with at least
 * `minInputs(group)` inputs. `tryPlan` plans a group for the
 * path (batch or streaming), or says why it cannot run as one UMJoin.
 */
final class GroupSplitting[T <: TreeNode[T], P](
    tsc: TwoStepConvert[T],
    roleOf: T => Option[MemberRole],
    minInputs: MultiJoinGroup[T] => Int,
    tryPlan: MultiJoinGroup[T] => Either[String, P],
    preferredCut: (MultiJoinGroup[T], P, Seq[Cut[T]]) => Option[Cut[T]] =
      (_: MultiJoinGroup[T], _: P, _: Seq[Cut[T]]) => None) {
  import GroupSplitting.NotAGroupRoot

  /** Either the group rooted at `root` with its accepted plan, or why `root` is not converted. */
  def groupAt(root: T): Either[String, (MultiJoinGroup[T], P)] = {

    def rootGroup(splitAt: Seq[T]): Option[MultiJoinGroup[T]] =
      tsc.createMultiJoinGroups(root, splitAt).find(_.root eq root)

    // Why the whole group could not run as one.
    var whole: Option[String] = None

    def attempt(splitAt: Seq[T]): Either[String, (MultiJoinGroup[T], P)] =
      rootGroup(splitAt) match {
        case None => Left(NotAGroupRoot)
        case Some(group) if group.inputs.size < minInputs(group) =>
          Left(s"its group has ${group.inputs.size} inputs, fewer than spark.umjoin.minInputs (" +
            s"${minInputs(group)})")
        case Some(group) => tryPlan(group) match {
          case Right(plan) => preferredCut(group, plan, cuts(group, roleOf)) match {
            case Some(cut) => attempt(splitAt :+ cut.node)
            case None => Right((group, plan))
          }
          case Left(reason) =>
            if (splitAt.isEmpty) whole = Some(reason)
            // Try each possible cut once; keep the one leaving the most inputs that plans, else the
            // one leaving the most inputs, and go on from there (a group too small to convert is
            // not planned).
            val possible = cuts(group, roleOf)
            if (possible.isEmpty) Left(s"the group cannot run as one UMJoin: $reason")
            else {
              val scored = possible.map { cut =>
                val rest = rootGroup(splitAt :+ cut.node)
                (cut, rest.exists(g => g.inputs.size >= minInputs(g) && tryPlan(g).isRight),
                  rest.map(_.inputs.size).getOrElse(0))
              }
              val best = scored.maxBy { case (_, plans, size) => (plans, size) }
              attempt(splitAt :+ best._1.node)
            }
        }
      }
    // The reason the whole group could not run decides; what splitting then ran into is a
    // consequence.
    attempt(Nil).left.map(reason =>
      whole.fold(reason)(first => s"the group cannot run as one UMJoin: $first"))
  }

  /**
   * Every group of the plan that runs as one UMJoin, outermost first, each with its plan: the
   * decisions `groupAt` takes when each node is reached top-down. The result feeds TSC step 2
   * (`TwoStepConvert.getMultiJoinNode`), which replaces exactly these groups. `declined` hears of
   * every group root left as it is, with the reason.
   */
  def acceptedGroups(root: T,
      declined: (T, String) => Unit = (_: T, _: String) => ()): Seq[(MultiJoinGroup[T], P)] = {
    def accepted(node: T): Seq[(MultiJoinGroup[T], P)] = groupAt(node) match {
      case Right((group, plan)) => (group, plan) +: group.inputs.flatMap(accepted)
      case Left(reason) =>
        if (reason != NotAGroupRoot) declined(node, reason)
        node.children.flatMap(accepted)
    }
    accepted(root)
  }

  /**
   * Where a group can be cut: above each join member except the root, including the pass-through
   * members right above it (so the cut-off input keeps their projection). Breadth-first order, so
   * ties keep cuts near the root.
   */
  private def cuts(group: MultiJoinGroup[T], roleOf: T => Option[MemberRole]): Seq[Cut[T]] = {
    def isMember(node: T): Boolean = group.members.exists(_ eq node)
    val outputOf = group.members.flatMap(m => m.children.filter(isMember).map(c => (c, m)))
    def output(node: T): Option[T] = outputOf.collectFirst { case (c, m) if c eq node => m }
    def chainTop(node: T): T = output(node) match {
      case Some(o) if (o ne group.root) && roleOf(o).contains(MemberRole.PassThrough) => chainTop(o)
      case _ => node
    }
    def inputsBelow(node: T): Set[Int] = node.children.flatMap { child =>
      if (isMember(child)) inputsBelow(child) else Seq(group.inputs.indexWhere(_ eq child))
    }.toSet
    group.members.filter(m => (m ne group.root) && roleOf(m).contains(MemberRole.Join))
      .map(join => Cut(chainTop(join), inputsBelow(join)))
  }
}

object GroupSplitting {
  /** Why `groupAt` declines a node that roots no group at all (not worth telling anyone). */
  val NotAGroupRoot = "it is not the root of a join group"
}
