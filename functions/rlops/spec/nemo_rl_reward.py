"""Whether a nemo-rl recipe's reward can be earned, checked before a GPU starts: the data's own reference answers,
given as the recipe's prompt asks the model to give them, scored against the ground truths NeMo RL builds from the
same rows, with the reward NeMo RL computes. A recipe whose gold answers do not score is refused: a run of it would
SUCCEED with `Avg Reward: 0.0000` at every step and learn nothing.

No I/O but reading rlops's own copies of the tag's prompt files: the rows come from the caller (`rlops train
--check-data FILE` reads a local file; each attempt's gate reads the real data, `checkpoints.gate`).

How NeMo RL reads and rewards a row, at v0.4.0 and v0.5.0 (`examples/run_grpo_math.py`; paths at the tag):

- `load_response_dataset` (data/datasets/response_datasets/__init__.py:97-117 at v0.4.0, :109-129 at v0.5.0) builds
  `ResponseDataset(train_data_path, **{val_data_path, input_key, output_key, train_split, val_split} present)`; a
  `.json`/`.jsonl` path goes to `load_dataset("json")` (data/datasets/utils.py `load_dataset_from_path`).
- `ResponseDataset.add_messages_key` (response_dataset.py; keys default to "input" and "output") makes each row
  `[{"role": "user", "content": row[input_key]}, {"role": "assistant", "content": row[output_key]}]`; at v0.5.0 a
  file that has a `messages` column is taken as it is (response_dataset.py:60).
- `setup_data` in run_grpo_math.py processes every task with `math_hf_data_processor` (data/processors.py), whose
  ground truth is `messages[1]["content"]`, verbatim, and rewards every task with `MathEnvironment`.
- `MathEnvironment` (environments/math_environment.py) with `env.math.verifier_type` "math" (its default, :244) and
  `math_verify_impl` "hf_math_verify" (its default, :310) scores with `HFVerifyWorker.verify` (:96-137): math-verify's
  `math_metric(gold_extraction_target=(LatexExtractionConfig(),), pred_extraction_target=(ExprExtractionConfig(),
  LatexExtractionConfig()))` on `(["\\boxed{" + ground_truth + "}"], [response])`; any exception, a timeout
  included, scores 0.0.

From v0.6.0 the data section is per dataset (`nemo_rl_data`), with a processor and an environment per entry: this
module does not follow that reading yet, and says so rather than guess.
"""

import json
import logging
import re
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from rlops.spec import nemo_rl
from rlops.spec.model import Recipe

MINIMUM = 0.9  # the mean reward of the gold answers below which a recipe is refused
SAMPLES = 64  # rows scored when the caller names no count
# The math-verify each tag's uv.lock pins (its pyproject names it without a version).
MATH_VERIFY = {"v0.4.0": "0.8.0", "v0.5.0": "0.8.0", "v0.6.0": "0.8.0", "v0.7.0": "0.9.0"}
ENTRYPOINT = "examples/run_grpo_math.py"
# The tags whose reading is followed here, with whether a file's own `messages` column is taken as it is.
MESSAGES_COLUMN = {"v0.4.0": False, "v0.5.0": True}

# GSM8K's final answer as its publisher grades it (openai/grade-school-math, grade_school_math/dataset.py
# `extract_answer`: this pattern, commas removed).
_GSM8K_FINAL = re.compile(r"#### (\-?[0-9\.\,]+)")


class Unchecked(Exception):
    """Why a recipe's reward cannot be checked here."""


def _gsm8k_final_answer(row: dict) -> dict:
    """The row with `answer` cut to what follows `####`, as NeMo RL's own gsm8k dataset does from v0.6.0
    (data/datasets/response_datasets/gsm8k.py `_extract_hash_answer`: None without one)."""
    answer = row.get("answer")
    final = answer.split("####")[1].strip() if isinstance(answer, str) and "####" in answer else None
    return {**row, "answer": final}


# What a recipe's data step may do to the rows it writes (`Recipe.data_steps`).
TRANSFORMS: dict[str, Callable[[dict], dict]] = {"gsm8k-final-answer": _gsm8k_final_answer}


@dataclass(frozen=True)
class Source:
    """One data file the composed config names, and where its rows are published."""

    role: str  # train or validation
    path: str  # what NeMo RL loads: data.train_data_path or data.val_data_path
    published: str  # where the rows come from as published: the data step's source, else the path itself
    transform: str | None = None  # the data step's, between the two


@dataclass(frozen=True)
class Check:
    """How the recipe's tag reads a row into a problem and a ground truth, and how a model is asked to answer."""

    tag: str
    problem_key: str
    answer_key: str
    messages_column: bool
    answer_as: str  # the answer as the prompt asks for it, %s standing for the answer
    prompt_file: str | None
    sources: tuple[Source, ...]

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, content: dict) -> "Check":
        return cls(**{**content, "sources": tuple(Source(**source) for source in content["sources"])})

    def describe(self) -> str:
        read = f"problem = {self.problem_key}, ground truth = {self.answer_key}"
        asked = self.prompt_file or "no prompt file"
        return (f"read as NeMo RL {self.tag}'s ResponseDataset and math_hf_data_processor read it: {read}; answered as "
                f"{asked} asks: {self.answer_as % 'ANSWER'}; rewarded as its MathEnvironment rewards (hf_math_verify, "
                f"math-verify {MATH_VERIFY[self.tag]} pinned)")


def check_for(tag: nemo_rl.Tag, recipe: Recipe, settings: dict) -> Check:
    """The check of a run of `recipe` with `settings` at `tag`; Unchecked when rlops cannot follow its reading."""
    if tag.name not in MESSAGES_COLUMN:
        raise Unchecked(f"rlops follows how NeMo RL {', '.join(MESSAGES_COLUMN)} read and reward data; {tag.name} "
                        "reads per-dataset entries with a processor and an environment each, which it does not "
                        "follow yet")
    if recipe.entrypoint != ENTRYPOINT:
        raise Unchecked(f"rlops follows {ENTRYPOINT}'s data and reward; this recipe runs {recipe.entrypoint}")
    composed = nemo_rl.compose(tag, recipe.config, nemo_rl.assignments(recipe, settings, nemo_rl.PLACEHOLDER_DIR))
    if composed.problems:
        raise Unchecked("the config does not compose: " + "; ".join(problem for _, problem in composed.problems))
    data, math = composed.config.get("data") or {}, (composed.config.get("env") or {}).get("math") or {}
    if data.get("dataset_name") != "ResponseDataset":
        raise Unchecked(f"rlops follows ResponseDataset's reading; {data.get('dataset_name')} is a built-in dataset "
                        "that reads its own source")
    verifier, implementation = math.get("verifier_type") or "math", math.get("math_verify_impl", "hf_math_verify")
    if (verifier, implementation) != ("math", "hf_math_verify"):
        raise Unchecked(f"rlops scores math-verify's reward (verifier_type math, math_verify_impl hf_math_verify); "
                        f"this config has {verifier} and {implementation}")
    prompts = [_prompt(tag, data.get(key)) for key in ("prompt_file", "system_prompt_file")]
    steps = {step.path: step for step in recipe.data_steps}
    sources = []
    for role, key in (("train", "train_data_path"), ("validation", "val_data_path")):
        path = data.get(key)
        if path:
            step = steps.get(path)
            sources.append(Source(role, path, step.source if step else path, step.transform if step else None))
    return Check(tag.name, data.get("input_key", "input"), data.get("output_key", "output"),
                 MESSAGES_COLUMN[tag.name], answer_shape(" ".join(filter(None, prompts))), data.get("prompt_file"),
                 tuple(sources))


def _prompt(tag: nemo_rl.Tag, path: str | None) -> str | None:
    if path is None:
        return None
    if path not in tag.prompts:
        raise Unchecked(f"{path} is not one of {tag.name}'s prompt files ({', '.join(sorted(tag.prompts))}): rlops "
                        "cannot tell how it asks for the answer")
    return (tag.root / path).read_text()


def answer_shape(prompt: str) -> str:
    """How a prompt asks the model to give its answer (%s for the answer): in \\boxed{} or <answer> tags, else bare."""
    if "boxed" in prompt:
        return "\\boxed{%s}"
    if "<answer>" in prompt:
        return "<answer>%s</answer>"
    return "%s"


def rows_of(lines: Iterable[str], limit: int | None = None) -> list[dict]:
    """The first `limit` rows of JSON Lines (blank lines skipped); a ValueError naming a line that is no JSON object."""
    rows: list[dict] = []
    for number, line in enumerate(lines, 1):
        if limit is not None and len(rows) >= limit:
            break
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as error:
            raise ValueError(f"line {number} is not JSON: {error}") from None
        if not isinstance(row, dict):
            raise ValueError(f"line {number} is a JSON {type(row).__name__}, not an object")
        rows.append(row)
    return rows


def readable(source: str) -> bool:
    """Whether rlops reads this data path's rows: JSON Lines at an https:// URL or a path (a Hugging Face dataset id
    is loaded by `datasets` alone)."""
    return source.endswith(".jsonl")


def reference_answer(value: Any) -> str | None:
    """The data's own final answer in a published field: GSM8K's `#### N` (as its publisher grades it), else the
    value itself."""
    if value is None:
        return None
    if isinstance(value, str):
        final = _GSM8K_FINAL.search(value)
        return final[1].replace(",", "") if final else value.strip()
    return str(value)


@cache
def _metric():
    from math_verify.metric import math_metric  # noqa: PLC0415 cold start: math-verify (sympy) takes ~1.5 s
    from math_verify.parser import ExprExtractionConfig, LatexExtractionConfig  # noqa: PLC0415 cold start: math-verify (sympy) takes ~1.5 s

    logging.getLogger("math_verify").setLevel(logging.CRITICAL)  # as HFVerifyWorker mutes it
    return math_metric(gold_extraction_target=(LatexExtractionConfig(),),
                       pred_extraction_target=(ExprExtractionConfig(), LatexExtractionConfig()))


def reward(ground_truth: Any, response: str | None) -> float:
    """HFVerifyWorker.verify for one response (math_environment.py at v0.4.0 and v0.5.0, :96-137)."""
    from math_verify.errors import TimeoutException  # noqa: PLC0415 cold start: math-verify (sympy) takes ~1.5 s

    if response is None:  # what math-verify scores it
        return 0.0
    try:
        score, _ = _metric()(["\\boxed{" + ground_truth + "}"], [response])
        return float(score)
    except (Exception, TimeoutException):  # NeMo RL scores any failure 0.0, a timeout too
        return 0.0


def math_verify_here() -> str | None:
    """The math-verify installed here; None when it is not."""
    try:
        return version("math-verify")
    except PackageNotFoundError:
        return None


@dataclass(frozen=True)
class Scored:
    row: int  # 1-based, among the rows read
    problem: Any
    ground_truth: Any
    reference: str | None
    response: str | None
    reward: float


@dataclass(frozen=True)
class Verdict:
    check: Check
    source: Source
    scored: tuple[Scored, ...]
    unreadable: str | None = None  # why NeMo RL could not read the rows at all

    @property
    def count(self) -> int:
        return len(self.scored)

    @property
    def mean(self) -> float:
        return sum(s.reward for s in self.scored) / len(self.scored) if self.scored else 0.0

    def earnable(self, minimum: float = MINIMUM) -> bool:
        return self.unreadable is None and bool(self.scored) and self.mean >= minimum

    def reason(self, minimum: float = MINIMUM) -> str:
        if self.unreadable:
            return self.unreadable
        if not self.scored:
            return "no rows to score"
        miss = self.example()
        at = f"NeMo RL {self.check.tag}"
        if isinstance(miss.ground_truth, str) and _GSM8K_FINAL.search(miss.ground_truth) \
                and miss.ground_truth.strip() != miss.reference:
            return (f"the ground truth {at} builds is the whole `{self.check.answer_key}` field, a worked solution "
                    f"ending in '#### {miss.reference}', not its final answer {miss.reference}: the math environment "
                    f"compares \\boxed{{<that solution>}} with the model's {miss.response} and scores 0. Keep only the "
                    "final number: a data step (data_steps: transform gsm8k-final-answer) writing the rows "
                    f"data.{'train' if self.source.role == 'train' else 'val'}_data_path names")
        return (f"the data's own reference answers, given as the prompt asks ({self.check.answer_as % 'ANSWER'}), "
                f"score {self.mean:.3f} on average against the ground truths {at} builds from "
                f"`{self.check.answer_key}`; at least {minimum} is needed")

    def example(self) -> Scored:
        """The first row whose gold answer did not earn the full reward (else the first row)."""
        return next((s for s in self.scored if s.reward < 1.0), self.scored[0])


def score(check: Check, source: Source, rows: list[dict]) -> Verdict:
    """Each published row of `source` through its data step, read as the tag reads it, its own reference answer
    scored against the ground truth built from it."""
    read = [TRANSFORMS[source.transform](row) for row in rows] if source.transform else rows
    columns = set().union(*read) if read else set()
    messages = check.messages_column and "messages" in columns
    missing = [key for key in (check.problem_key, check.answer_key) if key not in columns]
    if not messages and missing:
        return Verdict(check, source, (), f"no row has {' or '.join(missing)} (it has {', '.join(sorted(columns))}): "
                                          f"ResponseDataset's add_messages_key raises KeyError and NeMo RL "
                                          f"{check.tag} stops while loading; set +data.input_key and "
                                          "+data.output_key to the row's question and answer keys")
    published_columns = set().union(*rows) if rows else set()
    scored = []
    for number, (row, as_read) in enumerate(zip(rows, read, strict=True), 1):
        problem, truth = _problem_and_truth(check, as_read, messages)
        _, published = _problem_and_truth(check, row, check.messages_column and "messages" in published_columns)
        reference = reference_answer(published)
        response = None if reference is None else check.answer_as % reference
        scored.append(Scored(number, problem, truth, reference, response, reward(truth, response)))
    return Verdict(check, source, tuple(scored))


def _problem_and_truth(check: Check, row: dict, messages: bool) -> tuple[Any, Any]:
    """messages[0] and messages[1]'s contents, as math_hf_data_processor takes them (a missing key: None, as the
    json loader fills a column a row lacks)."""
    if messages:
        log = row.get("messages") or []
        problem, truth = (log[i].get("content") if len(log) > i and isinstance(log[i], dict) else None
                          for i in (0, 1))
        return problem, truth
    return row.get(check.problem_key), row.get(check.answer_key)


def for_job(tag: nemo_rl.Tag | None, recipe: Recipe, settings: dict, place: Callable[[str], str],
            samples: int = SAMPLES) -> dict | None:
    """What an attempt's gate does with the data before the workload (`checkpoints.gate --data`): the recipe's data
    steps, then the check on the real data (or why there is none); None when there is neither. `tag`: the image's
    (None: rlops has no copy of it); `place` maps a Lustre path to where the gate's node mounts it."""
    steps = [{"source": place(step.source), "path": place(step.path), "transform": step.transform}
             for step in recipe.data_steps]
    check, unchecked = None, None
    if recipe.runner == "nemo-rl" and tag is not None:
        try:
            check = check_for(tag, recipe, settings)
        except Unchecked as why:
            unchecked = str(why)
    if not steps and check is None:
        return None
    placed = check and replace(check, sources=tuple(
        replace(source, path=place(source.path), published=place(source.published)) for source in check.sources))
    return {"steps": steps, "check": placed and placed.to_json(), "unchecked": unchecked, "samples": samples,
            "minimum": MINIMUM}
