package umjoin.spark.core.tsc

import java.util.IdentityHashMap

import scala.collection.mutable

import org.apache.spark.sql.catalyst.trees.TreeNode

/** What the member patterns (rules/) allow a plan node to be inside a multi-way join group. */
sealed trait MemberRole

object MemberRole {
  /**
   * A binary join: it joins the group of its output, or else starts a group (Algorithm 2, l.
   * 13-15).
   */
  case object Join extends MemberRole
  /** A node between joins (the paper's HashNode): it can only join the group of its output. */
  case object PassThrough extends MemberRole
}

/**
 * A binary join tree found in a plan (the paper's MultiJoinGroup). `root` is its top join,
 * `members` all its nodes breadth-first from the root, and `inputs` the children of members that
 * are not members, left to right: the inputs of the multi-way join node that replaces the group
 * (Algorithm 3, lines 13-20).
 */
final case class MultiJoinGroup[T](root: T, members: Seq[T], inputs: Seq[T])

/**
 * Two-Step Convert (UMJoin paper 000, section 3.2): step 1 finds the groups, step 2 replaces each
 * group by one multi-way join node. Generic over the plan type, so batch (logical plans) and
 * streaming (physical plans) share it. `roleOf` is the paper's canBeMultiJoinGroupMember.
 *
 * Plan nodes are compared by identity, never by equality: the two sides of a self-join are equal
 * trees but different nodes. `keptAsInput(output, child)` says a child stays an input of its
 * output's group whatever its role: the right side of a semi or anti join, which the multi-way
 * join probes as one store.
 */
final class TwoStepConvert[T <: TreeNode[T]](roleOf: T => Option[MemberRole],
    keptAsInput: (T, T) => Boolean = (_: T, _: T) => false) {

  /** Algorithm 1. */
  def convert(root: T, createMultiJoinNode: (MultiJoinGroup[T], Seq[T]) => T): T =
    getMultiJoinNode(root, createMultiJoinGroups(root), createMultiJoinNode)

  /**
   * Step 1 (Algorithm 2). Breadth-first from the root, a member joins the group of its output when
   * that output is in a group; a join that cannot starts a new group. Nodes in `splitAt` never join
   * their output's group: the plan is cut there, so the node's subtree forms groups of its own.
   * Groups are returned in the order their roots were met (outermost first).
   */
  def createMultiJoinGroups(root: T, splitAt: Seq[T] = Nil): Seq[MultiJoinGroup[T]] = {
    val outputOf = new IdentityHashMap[T, T]()
    val groupRootOf = new IdentityHashMap[T, T]()
    val roots = mutable.ArrayBuffer[T]()
    getOrderedNodes(root, outputOf).foreach { node =>
      roleOf(node).foreach { role =>
        canBeInSameGroupWithOutputs(node, outputOf, groupRootOf, splitAt) match {
          case Some(groupRoot) => groupRootOf.put(node, groupRoot)
          case None if role == MemberRole.Join =>
            groupRootOf.put(node, node)
            roots += node
          case None =>
        }
      }
    }
    roots.toSeq.map(groupRootedAt(_, groupRootOf))
  }

  /**
   * Step 2 (Algorithm 3): rebuilds the plan bottom-up; each group root becomes the node made by
   * `createMultiJoinNode` from the group and its (already converted) inputs. The visited map makes
   * every node converted once.
   */
  def getMultiJoinNode(
      root: T,
      groups: Seq[MultiJoinGroup[T]],
      createMultiJoinNode: (MultiJoinGroup[T], Seq[T]) => T): T = {
    val groupByRoot = new IdentityHashMap[T, MultiJoinGroup[T]]()
    groups.foreach(g => groupByRoot.put(g.root, g))
    val visited = new IdentityHashMap[T, T]()

    def visit(node: T): T = Option(visited.get(node)).getOrElse {
      val newChildren = node.children.map(visit)
      val unchanged = newChildren.zip(node.children).forall { case (n, o) => n eq o }
      val withNewInputs = if (unchanged) node else node.withNewChildren(newChildren)
      val ret = Option(groupByRoot.get(node)) match {
        case Some(group) => createMultiJoinNode(group, group.inputs.map(visited.get))
        case None => withNewInputs
      }
      visited.put(node, ret)
      ret
    }
    visit(root)
  }

  /** Breadth-first order from the root (getOrderedNodes); records each node's output. */
  private def getOrderedNodes(root: T, outputOf: IdentityHashMap[T, T]): Seq[T] = {
    val ordered = mutable.ArrayBuffer[T]()
    val queue = mutable.Queue[T](root)
    while (queue.nonEmpty) {
      val node = queue.dequeue()
      ordered += node
      node.children.foreach { child =>
        outputOf.put(child, node)
        queue.enqueue(child)
      }
    }
    ordered.toSeq
  }

  /** The group of the node's output if the node may join it (Algorithm 2, lines 20-34). */
  private def canBeInSameGroupWithOutputs(
      node: T,
      outputOf: IdentityHashMap[T, T],
      groupRootOf: IdentityHashMap[T, T],
      splitAt: Seq[T]): Option[T] = {
    // Plans are trees: a node has at most one output, so "all outputs in one group" is that
    // output's group.
    if (splitAt.exists(_ eq node)) None
    else Option(outputOf.get(node)).filterNot(keptAsInput(_, node))
      .flatMap(output => Option(groupRootOf.get(output)))
  }

  private def groupRootedAt(root: T, groupRootOf: IdentityHashMap[T, T]): MultiJoinGroup[T] = {
    def isMember(node: T): Boolean = groupRootOf.get(node) eq root
    val members = mutable.ArrayBuffer[T]()
    val queue = mutable.Queue[T](root)
    while (queue.nonEmpty) {
      val node = queue.dequeue()
      members += node
      queue.enqueueAll(node.children.filter(isMember))
    }
    def inputsBelow(node: T): Seq[T] =
      node.children.flatMap(child => if (isMember(child)) inputsBelow(child) else Seq(child))
    MultiJoinGroup(root, members.toSeq, inputsBelow(root))
  }
}
