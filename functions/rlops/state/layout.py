"""Every object rlops keeps in an environment's state bucket, named in one place.

    PREFIX/locks/ENV.json                       the environment's lock (apply, destroy, reap, wake)
    PREFIX/environments/ENV/resources.json      the cloud resources rlops created
    PREFIX/environments/ENV/applied.json        the last complete apply: spec digest, commit
    PREFIX/environments/ENV/pool.json           the GPU pool: scaled down or not, since, wakes
    PREFIX/environments/ENV/runs/RUN.json       a run's record
    PREFIX/environments/ENV/runs/RUN/attempt-N.log            an ended attempt's output
    PREFIX/environments/ENV/runs/RUN/attempt-N.metrics.json   its per-step series
    PREFIX/environments/ENV/runs/RUN/manifests/step-N.json    a complete checkpoint's manifest
    PREFIX/environments/ENV/runs/RUN/report/FILE              the run's report (markdown, PNGs)
    PREFIX/environments/ENV/refusals/RUN/MESSAGE.json         why the train function refused a message for RUN
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Layout:
    prefix: str
    environment: str

    @property
    def lock(self) -> str:
        return f"{self.prefix}/locks/{self.environment}.json"

    @property
    def folder(self) -> str:
        return f"{self.prefix}/environments/{self.environment}/"

    @property
    def resources(self) -> str:
        return f"{self.folder}resources.json"

    @property
    def applied(self) -> str:
        return f"{self.folder}applied.json"

    @property
    def pool(self) -> str:
        return f"{self.folder}pool.json"

    @property
    def runs(self) -> str:
        """The folder of run records: RUN.json directly in it, each run's other objects under RUN/."""
        return f"{self.folder}runs/"

    def run(self, run: str) -> str:
        return f"{self.runs}{run}.json"

    def attempt_log(self, run: str, attempt: int) -> str:
        return f"{self.runs}{run}/attempt-{attempt}.log"

    def attempt_metrics(self, run: str, attempt: int) -> str:
        return f"{self.runs}{run}/attempt-{attempt}.metrics.json"

    def manifests(self, run: str) -> str:
        """The common start of a run's manifest names (list by this prefix, then read the step)."""
        return f"{self.runs}{run}/manifests/step-"

    def manifest(self, run: str, step: int) -> str:
        return f"{self.manifests(run)}{step}.json"

    def replaced_manifest(self, run: str, step: int, save: str) -> str:
        """Where the manifest of an earlier save of a step goes when the step is saved again."""
        return f"{self.runs}{run}/replaced-manifests/step-{step}-{save}.json"

    def exports(self, run: str) -> str:
        """Where `rlops checkpoints export` puts a run's checkpoints by default: EXPORTS/step-N/..."""
        return f"{self.runs}{run}/exports"

    def report(self, run: str, name: str = "") -> str:
        return f"{self.runs}{run}/report/{name}"

    def refusals(self, run: str) -> str:
        """The folder of a run's refused train messages. Outside runs/, which every watch tick lists whole."""
        return f"{self.folder}refusals/{run}/"

    def refusal(self, run: str, message: str) -> str:
        return f"{self.refusals(run)}{message}.json"
