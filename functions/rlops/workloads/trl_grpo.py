"""The local recipe: real GRPO (TRL's GRPOTrainer) on a tiny causal LM, on CPU, with no downloads.

    python -m rlops.workloads.trl_grpo --output-dir DIR [key=value ...]

The model is built from a config and the tokenizer in code; the prompts are arithmetic word
problems generated from the seed; the reward is 1 when the last number of the completion is the
answer, with partial credit for form and closeness below that (`shaped_reward`). It saves `checkpoint-N/` every
`save_steps` and, started again on the same directory, resumes from the newest one, as a preempted run must.
Progress goes to stdout as
`[rlops] step=N reward=R loss=L seconds=S`, `[rlops] metrics step=N {JSON}` (TRL's other numbers for the step)
and `[rlops] checkpoint step=N seconds=S` lines, which the watcher reads.

`--gpus RESOURCE=COUNT` runs it as NeMo RL runs a job (`nemo_rl_driver`): this process, the driver, may be on a
node without the resource; it checks the cluster for COUNT of it with NeMo RL's retries (failing as NeMo RL fails),
then trains in a Ray actor that holds them, with the driver's environment copied into it as NeMo RL copies it.

`pause_while=NAME` holds the run after each step for as long as a file NAME exists in the output
directory: whoever made the file decides when the run goes on (the local-loop tests use it to keep
a run RUNNING exactly as long as they need, instead of hoping it is still running).
"""

import argparse
import json
import os
import random
import re
import sys
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from rlops.runs.progress import last_complete_checkpoint as newest_complete

# The local recipe's own packages (torch, transformers, TRL, datasets: requirements-local.txt, optional) are
# imported where they are used, so that the rest of this module (its settings, reward and checkpoint helpers, which
# rlops's tests import) needs none of them.
if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerFast

# Set before transformers/datasets are imported: any hub call fails at once instead of hanging.
for _offline in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
    os.environ[_offline] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

SETTINGS = {"max_steps": int, "learning_rate": float, "seed": int, "num_generations": int, "save_steps": int,
            "max_completion_length": int, "pause_while": str}
DEFAULTS = {"max_steps": 6, "learning_rate": 3e-3, "seed": 0, "num_generations": 4, "save_steps": 2,
            "max_completion_length": 8, "pause_while": ""}
SPECIALS = ("<pad>", "<eos>", "<unk>")  # the vocabulary's first ids; <eos> begins a sequence too
CHARACTERS = "0123456789abcdefghijklmnopqrstuvwxyz ?.,"
NAMES = ("ann", "bob", "kim", "lee", "max", "sam")
THINGS = ("apples", "books", "coins", "pens", "shells")


def parse(argv: list[str]) -> tuple[str, dict, tuple[str, int] | None]:
    parser = argparse.ArgumentParser(prog="rlops.workloads.trl_grpo")
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--gpus", metavar="RESOURCE=COUNT", help="drive the training as NeMo RL does, in an actor "
                        "holding COUNT of the Ray resource that stands for GPUs")
    parser.add_argument("settings", nargs="*", metavar="key=value")
    args = parser.parse_args(argv)
    gpus = None
    if args.gpus:
        resource, _, count = args.gpus.partition("=")
        if not resource or not count.isdigit() or int(count) < 1:
            parser.error(f"--gpus takes RESOURCE=COUNT (a positive count), not {args.gpus!r}")
        gpus = (resource, int(count))
    settings = dict(DEFAULTS)
    for item in args.settings:
        key, _, value = item.partition("=")
        if key not in SETTINGS:
            parser.error(f"unknown setting {key!r}; known: {', '.join(sorted(SETTINGS))}")
        settings[key] = SETTINGS[key](value)
    if not re.fullmatch(r"(\w[\w.-]*)?", settings["pause_while"]):
        parser.error(f"pause_while must be a file name in the output directory, not {settings['pause_while']!r}")
    return args.output_dir, settings, gpus


def problems(seed: int, count: int = 200) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        name, thing = rng.choice(NAMES), rng.choice(THINGS)
        a, b = rng.randint(1, 40), rng.randint(1, 40)
        if rng.random() < 0.5:
            text, answer = f"{name} has {a} {thing} and gets {b} more. how many?", a + b
        else:
            a, b = max(a, b), min(a, b)
            text, answer = f"{name} has {a} {thing} and gives away {b}. how many?", a - b
        rows.append({"prompt": text + " ", "answer": str(answer)})
    return rows


def shaped_reward(completions: list[str], answer: list[str], **_: object) -> list[float]:
    """1.0 when the completion's last number is the answer; otherwise partial credit, so that a tiny model that
    never hits the answer still sees some completions beat others (with equal rewards GRPO's advantages are
    zero and nothing is learned): up to 0.5 for form (the share of the completion that is digits) and up to
    0.4 for closeness of its last number to the answer."""
    rewards = []
    for completion, expected in zip(completions, answer, strict=True):
        numbers = re.findall(r"\d+", completion)
        if numbers and numbers[-1] == expected:
            rewards.append(1.0)
            continue
        form = sum(c.isdigit() for c in completion) / max(1, len(completion))
        closeness = 1 / (1 + abs(int(numbers[-1]) - int(expected))) if numbers else 0.0
        rewards.append(0.5 * form + 0.4 * closeness)
    return rewards


def metrics_line(logs: dict[str, Any]) -> str:
    """Every number TRL logged for a step but the two the step line carries, as compact JSON with six significant
    digits (the report plots them; 17-digit floats only bloat the job's output and the run's series)."""
    return json.dumps({name: float(f"{value:.6g}") for name, value in sorted(logs.items())
                       if name not in ("reward", "loss") and isinstance(value, (int, float))
                       and not isinstance(value, bool)}, separators=(",", ":"))


def tokenizer() -> "PreTrainedTokenizerFast":
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers  # noqa: PLC0415 optional (above)
    from transformers import PreTrainedTokenizerFast  # noqa: PLC0415 optional (above)

    vocab = {token: i for i, token in enumerate([*SPECIALS, *CHARACTERS])}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", bos_token="<eos>",
                                   unk_token="<unk>", padding_side="left")


def model(tok: "PreTrainedTokenizerFast", seed: int) -> "PreTrainedModel":
    import torch  # noqa: PLC0415 optional (above)
    from transformers import AutoModelForCausalLM, Qwen2Config  # noqa: PLC0415 optional (above)

    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         tie_word_embeddings=False, pad_token_id=SPECIALS.index("<pad>"),
                         eos_token_id=SPECIALS.index("<eos>"), bos_token_id=SPECIALS.index("<eos>"))
    return AutoModelForCausalLM.from_config(config)


def last_complete_checkpoint(output_dir: str) -> str | None:
    """The newest checkpoint whose save finished; a half-written one (its node was lost mid-save) is moved aside.

    transformers' get_last_checkpoint goes by the directory name alone and would resume from the torn one.
    """
    directory = Path(output_dir)
    directory.mkdir(parents=True, exist_ok=True)
    step = newest_complete(directory)
    for torn in directory.glob("checkpoint-*"):
        if torn.name.removeprefix("checkpoint-").isdigit() and not (torn / "trainer_state.json").is_file():
            aside = directory / f"incomplete-{torn.name}-{os.getpid()}"
            torn.rename(aside)
            print(f"[rlops] {torn.name} was never finished; moved it to {aside.name}", flush=True)
    return None if step is None else str(directory / f"checkpoint-{step}")


def _readable(path: str | None) -> bool:
    """Whether the token file Hugging Face would read is there for this process: the token reaches the Ray nodes
    as a file alone (rlops.kube.tokens), so this says whether the node got it without printing it."""
    try:
        with open(path or "", encoding="utf-8") as file:
            return bool(file.read().strip())
    except OSError:
        return False


def main(argv: list[str] | None = None) -> int:
    output_dir, settings, gpus = parse(sys.argv[1:] if argv is None else argv)
    if gpus:
        # This module by its name, not as __main__: the actor imports `train` from it rather than unpickling a copy.
        from rlops.workloads import nemo_rl_driver, trl_grpo  # noqa: PLC0415 this module by name; Ray only with --gpus

        nemo_rl_driver.init_ray()
        nemo_rl_driver.check(*gpus)
        step = nemo_rl_driver.run_on_pool(*gpus, trl_grpo.train, output_dir, settings)
    else:
        step = train(output_dir, settings)
    print(f"[rlops] done step={step}", flush=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skips ~2 s of interpreter teardown; the checkpoints are already written


def train(output_dir: str, settings: dict[str, Any]) -> int:
    """The whole run, resumed from the newest complete checkpoint in `output_dir`; its last step."""
    warnings.filterwarnings("ignore", message=".*gradient_checkpointing.*", category=FutureWarning)
    # After the filter above: TRL warns as it loads.
    from datasets import Dataset  # noqa: PLC0415 optional (above)
    from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments  # noqa: PLC0415 (above)
    from trl.trainer.grpo_config import GRPOConfig  # noqa: PLC0415 optional (above)
    from trl.trainer.grpo_trainer import GRPOTrainer, RewardFunc  # noqa: PLC0415 optional (above)

    class Progress(TrainerCallback):
        # The Trainer calls on_step_end, then logs, then saves: a step's time is begin to end, a save's is
        # from that end (after any pause) to on_save.
        began = ended = step_seconds = 0.0

        def on_step_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                          **kwargs: Any) -> None:
            self.began = time.monotonic()

        def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                   logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
            if logs and "reward" in logs:
                print(f"[rlops] step={state.global_step} reward={logs['reward']:.4f} loss={logs.get('loss', 0.0):.4f} "
                      f"seconds={self.step_seconds:.3f}", flush=True)
                print(f"[rlops] metrics step={state.global_step} {metrics_line(logs)}", flush=True)

        def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> None:
            print(f"[rlops] checkpoint step={state.global_step} seconds={time.monotonic() - self.ended:.3f}",
                  flush=True)

        def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                        **kwargs: Any) -> None:
            self.step_seconds = time.monotonic() - self.began
            gate = os.path.join(output_dir, settings["pause_while"])
            if settings["pause_while"] and os.path.exists(gate):
                print(f"[rlops] paused after step={state.global_step} while {settings['pause_while']} exists",
                      flush=True)
                while os.path.exists(gate):
                    time.sleep(0.05)
            self.ended = time.monotonic()

    last = last_complete_checkpoint(output_dir)
    print(f"[rlops] {'resuming from ' + os.path.basename(last) if last else 'starting fresh'} "
          f"(max_steps={settings['max_steps']}, seed={settings['seed']}; "
          f"HF token file {'readable' if _readable(os.environ.get('HF_TOKEN_PATH')) else 'not readable'}; "
          f"HF_TOKEN {'in' if 'HF_TOKEN' in os.environ else 'not in'} the environment)", flush=True)
    tok = tokenizer()
    generations = settings["num_generations"]
    config = GRPOConfig(
        output_dir=output_dir, max_steps=settings["max_steps"], save_strategy="steps",
        save_steps=settings["save_steps"], logging_steps=1, per_device_train_batch_size=generations,
        num_generations=generations, max_completion_length=settings["max_completion_length"],
        learning_rate=settings["learning_rate"], lr_scheduler_type="constant", use_cpu=True, bf16=False,
        activation_checkpointing=False, beta=0.0, seed=settings["seed"], report_to="none", disable_tqdm=True,
        dataloader_num_workers=0)
    # TRL types a reward function as returning list[float | None]; a list of floats is one (it only reads it).
    reward = cast(RewardFunc, shaped_reward)
    trainer = GRPOTrainer(model=model(tok, settings["seed"]), reward_funcs=[reward], args=config,
                          train_dataset=Dataset.from_list(problems(settings["seed"])), processing_class=tok,
                          callbacks=[Progress()])
    trainer.train(resume_from_checkpoint=last)
    return trainer.state.global_step


if __name__ == "__main__":
    sys.exit(main())
