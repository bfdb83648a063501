package umjoin.spark.core.tsc

import java.io.{File, IOException}
import java.nio.charset.StandardCharsets
import java.nio.file.Files

import scala.jdk.CollectionConverters._
import scala.util.{Failure, Success, Try}

import com.fasterxml.jackson.core.JsonProcessingException
import com.fasterxml.jackson.databind.{JsonNode, ObjectMapper}
import com.fasterxml.jackson.dataformat.yaml.YAMLFactory

import org.apache.spark.sql.catalyst.trees.TreeNode
import org.apache.spark.sql.catalyst.plans.JoinType

/** A plan node class a rules file may name, and whether it is a binary join or a unary node. */
final case class NodeKind[T](matches: T => Boolean, isJoin: Boolean)

/**
 * A condition a rules file may put under `when`. `build` turns the YAML argument into the test,
 * or says why the argument is wrong; `fails` says what a node failing it is, for the users told why
 * a join stays Spark's. Safety never depends on these: the planner checks every group it converts
 * on its own; a pattern only decides which nodes TSC tries to group.
 */
final case class Check[T](appliesTo: Set[String], argument: String,
    build: JsonNode => Either[String, T => Boolean], fails: String)

/** The node kinds and checks the rules for one plan type (logical or physical) may use. */
final case class PatternVocabulary[T](planType: String, nodeKinds: Map[String, NodeKind[T]],
    checks: Map[String, Check[T]])

/**
 * One entry of a rules file: a node kind, its role, and the checks that must all hold (each with
 * what its failure means).
 */
final case class MemberPattern[T](nodeKind: String, role: MemberRole,
    checks: Seq[(T => Boolean, String)], aboveJoin: Boolean)

/**
 * The paper's canBeMultiJoinGroupMember as data: the first pattern matching a node gives its role.
 * `aboveJoin` is the paper's "node.inputs[0] is JoinNode", through other pass-through members.
 */
final case class MemberPatterns[T <: TreeNode[T]](source: String, patterns: Seq[MemberPattern[T]],
    vocabulary: PatternVocabulary[T]) {

  def roleOf(node: T): Option[MemberRole] = patterns.collectFirst {
    case p if matches(p, node) => p.role
  }

  /**
   * Why `node` is no member, said for users: the first check it fails of the first pattern naming
   * its kind (None: it is a member, or no pattern names its kind).
   */
  def whyNot(node: T): Option[String] =
    if (roleOf(node).isDefined) None
    else patterns.find(p => vocabulary.nodeKinds(p.nodeKind).matches(node))
      .flatMap(_.checks.collectFirst { case (test, fails) if !test(node) => fails })

  private def matches(pattern: MemberPattern[T], node: T): Boolean =
    vocabulary.nodeKinds(pattern.nodeKind).matches(node) &&
      pattern.checks.forall(_._1(node)) &&
      (!pattern.aboveJoin || node.children.headOption.exists(child => roleOf(child).isDefined))
}

/** A rules file that cannot be used; the message names the file and the problem. */
final class RulesException(message: String) extends IllegalArgumentException(message)

object MemberPatterns {
  private val BuiltInLocation = "umjoin/rules/"

  /**
   * Loads `<name>.yaml` from `rulesDir` if given (spark.umjoin.rulesDir), else the rules built into
   * the jar from the repository's rules/ directory.
   */
  def load[T <: TreeNode[T]](name: String, rulesDir: Option[String],
      vocabulary: PatternVocabulary[T]): MemberPatterns[T] =
    rulesDir match {
      case Some(dir) =>
        val file = new File(dir, s"$name.yaml")
        val text = Try(new String(Files.readAllBytes(file.toPath), StandardCharsets.UTF_8)) match {
          case Success(t) => t
          case Failure(e: java.nio.file.NoSuchFileException) =>
            throw new RulesException(s"UMJoin rules file ${file.getPath}" +
              s" is missing (spark.umjoin.rulesDir=$dir). " + s"Copy rules/$name" +
              (".yaml from the UMJoin repository there, or unset spark.umjoin.rulesDir to use " +
                "the built-in rules."))
          case Failure(e: IOException) =>
            throw new RulesException(
              s"UMJoin rules file ${file.getPath} cannot be read: $e. Check its permissions.")
          case Failure(e) => throw e
        }
        parse(file.getPath, text, vocabulary)
      case None =>
        val resource = BuiltInLocation + s"$name.yaml"
        val stream = Option(getClass.getClassLoader.getResourceAsStream(resource)).getOrElse {
          throw new RulesException(s"UMJoin built-in rules $resource" +
            " are missing from the UMJoin jar; rebuild it with `make build`.")
        }
        val text =
          try new String(stream.readAllBytes(), StandardCharsets.UTF_8) finally stream.close()
        parse(s"built-in $resource", text, vocabulary)
    }

  def parse[T <: TreeNode[T]](source: String, text: String,
      vocabulary: PatternVocabulary[T]): MemberPatterns[T] = {
    def fail(problem: String): Nothing =
      throw new RulesException(s"UMJoin rules file $source: $problem")

    val root = try new ObjectMapper(new YAMLFactory()).readTree(text) catch {
      case e: JsonProcessingException =>
        val where = Option(e.getLocation)
          .map(l => s" at line ${l.getLineNr}, column ${l.getColumnNr}").getOrElse("")
        fail(s"not valid YAML$where: ${e.getOriginalMessage}")
    }
    if (root == null || !root.isObject)
      fail("expected a mapping with the keys `plan` and `members`")
    unknownKeys(root, Set("plan", "members"))
      .foreach(k => fail(s"unknown key `$k`; expected `plan` and `members`"))
    val plan = Option(root.get("plan")).filter(_.isTextual).map(_.asText)
      .getOrElse(fail("`plan` is missing or not a string"))
    if (plan != vocabulary.planType)
      fail(s"`plan: $plan` does not fit here: these rules are for ${vocabulary.planType} plans")
    val members = Option(root.get("members")).filter(n => n.isArray && n.size > 0)
      .getOrElse(fail("`members` is missing or empty; list at least one member pattern"))

    val patterns = members.elements.asScala.zipWithIndex.map { case (entry, i) =>
      def failEntry(problem: String): Nothing = fail(s"member ${i + 1}: $problem")
      if (!entry.isObject) failEntry("expected a mapping with `node`, `role` and optionally `when`")
      unknownKeys(entry, Set("node", "role", "when"))
        .foreach(k => failEntry(s"unknown key `$k`; expected `node`, `role`, `when`"))
      val kindName = Option(entry.get("node")).filter(_.isTextual).map(_.asText)
        .getOrElse(failEntry("`node` is missing"))
      val kind = vocabulary.nodeKinds.getOrElse(kindName, failEntry(
        s"unknown node `$kindName`; ${vocabulary.planType} plans know " +
          s"${vocabulary.nodeKinds.keys.toSeq.sorted.mkString(", ")}"))
      val role = Option(entry.get("role")).map(_.asText) match {
        case Some("join") if kind.isJoin => MemberRole.Join
        case Some("passThrough") if !kind.isJoin => MemberRole.PassThrough
        case Some(r @ ("join" | "passThrough")) =>
          failEntry(s"`$kindName` cannot have role `$r`: " +
            (if (kind.isJoin) "a join node has role `join`" else "only join nodes have role " +
              "`join`; use `passThrough`"))
        case Some(other) => failEntry(s"unknown role `$other`; expected `join` or `passThrough`")
        case None => failEntry("`role` is missing (join or passThrough)")
      }
      val when = Option(entry.get("when")).getOrElse(new ObjectMapper().createObjectNode())
      if (!when.isObject) failEntry("`when` must be a mapping from check name to its argument")
      var aboveJoin = false
      val checks = when.properties.asScala.toSeq.flatMap { field =>
        val name = field.getKey
        val arg = field.getValue
        if (name == "aboveJoin") {
          if (!(arg.isBoolean && arg.asBoolean))
            failEntry("check `aboveJoin` takes `true`; remove the line to drop it")
          if (kind.isJoin) failEntry("check `aboveJoin` applies to pass-through nodes, not joins")
          aboveJoin = true
          None
        } else {
          val check = vocabulary.checks.getOrElse(name, failEntry(
            s"unknown check `$name`; known checks: " +
              s"${(vocabulary.checks.keys.toSeq :+ "aboveJoin").sorted.mkString(", ")}"))
          if (!check.appliesTo.contains(kindName)) failEntry(s"check `$name` does not apply to `" +
            s"$kindName` (it applies to ${check.appliesTo.toSeq.sorted.mkString(", ")})")
          check.build(arg) match {
            case Right(test) => Some((test, check.fails))
            case Left(problem) => failEntry(s"check `$name` ${check.argument}: $problem")
          }
        }
      }
      MemberPattern[T](kindName, role, checks, aboveJoin)
    }.toSeq
    if (!patterns.exists(_.role == MemberRole.Join))
      fail("no member has role `join`, so no group could ever start")
    MemberPatterns(source, patterns, vocabulary)
  }

  private def unknownKeys(node: JsonNode, known: Set[String]): Option[String] =
    node.fieldNames.asScala.find(k => !known.contains(k))

  /** A check whose only argument is `true` (the rules file states it holds). */
  /**
   * The `joinType` check: the node's join type is one of a list of `supported` names; `unsupported`
   * says why a name outside it cannot be a member; `joinTypeOf` reads a node's join type.
   */
  def joinTypes[T](appliesTo: Set[String], supported: Map[String, JoinType],
      unsupported: String)(joinTypeOf: T => Option[JoinType]): Check[T] =
    Check(appliesTo,
      s"takes a list of join types (supported: ${supported.keys.toSeq.sorted.mkString(", ")})",
      fails = "UMJoin does not compute its join type", build = arg => {
        val names = if (arg.isArray) arg.elements.asScala.map(_.asText).toSeq else Seq.empty
        val unknown = names.filterNot(supported.contains)
        if (names.isEmpty) Left("expected a non-empty list such as [Inner]")
        else if (unknown.nonEmpty) Left(s"${unknown.mkString(", ")} $unsupported")
        else {
          val types = names.map(supported).toSet
          Right(node => joinTypeOf(node).exists(types.contains))
        }
      })

  def flag[T](appliesTo: Set[String], fails: String)(test: T => Boolean): Check[T] =
    Check(appliesTo, "takes `true`", arg =>
      if (arg.isBoolean && arg.asBoolean)
        Right(test) else Left("remove the line to drop the check"), fails)
}
