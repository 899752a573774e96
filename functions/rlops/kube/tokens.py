"""How the spec's tokens reach the Ray nodes: as files, with the libraries that use them pointed at the files.

No process environment of a Ray node holds a token. NeMo RL's `init_ray` passes the driver's whole
`os.environ` as the runtime env that every actor inherits (nemo_rl/distributed/virtual_cluster.py,
v0.4.0-v0.7.0), and Ray serves the runtime envs of actors and tasks in plain text to anyone who
reaches its dashboard (`/api/v0/actors?detail=1`, `/api/v0/tasks?detail=1`, and `runtime_env_agent.log`
through the log API). A path in the environment gives nothing away.

Each secret is a file named after it. Hugging Face's hub library reads its token from the file at
`HF_TOKEN_PATH` when `HF_TOKEN` is unset (huggingface_hub's constants.py and utils/_auth.py; as in
0.34.4, which NeMo RL v0.5.0 pins). W&B takes its API key from `WANDB_API_KEY`, then the `api_key` of
its settings file, then the netrc file at `NETRC` (else ~/.netrc):
https://docs.wandb.ai/models/ref/python/functions/login. The netrc route is the one every supported
NeMo RL image's W&B has (0.21.1 in v0.4.0 and v0.5.0: wandb/sdk/lib/apikey.py's `api_key` looks the
base URL's host up with requests' `get_netrc_auth`, and `get_netrc_file_path` honours `NETRC`; 0.28.0
in v0.7.0: wandb/sdk/lib/wbauth/wbnetrc.py), so W&B's key is also written as a netrc file.
"""

from collections.abc import Collection

# Where the Ray pods mount their Secret (read-only, each file 0400).
DIRECTORY = "/var/run/secrets/rlops"
# A key no spec secret can have: secret names are environment variable names, upper case.
NETRC = "netrc"
# W&B's default server (its settings' base_url); a netrc entry is looked up by the host alone.
WANDB_HOST = "api.wandb.ai"


def files(values: dict[str, str]) -> dict[str, str]:
    """The files of the tokens directory, by name, from the secrets' values by secret name."""
    found = dict(values)
    if "WANDB_API_KEY" in values:
        found[NETRC] = f"machine {WANDB_HOST}\n  login user\n  password {values['WANDB_API_KEY']}\n"
    return found


def names(secrets: Collection[str]) -> list[str]:
    """The names of the files `files` makes from these secret names."""
    return sorted(files({name: "" for name in secrets}))


def pointers(directory: str, secrets: Collection[str]) -> dict[str, str]:
    """The environment that points Hugging Face and W&B at their token files in `directory`: paths only."""
    found = {}
    if "HF_TOKEN" in secrets:
        found["HF_TOKEN_PATH"] = f"{directory}/HF_TOKEN"
    if "WANDB_API_KEY" in secrets:
        found["NETRC"] = f"{directory}/{NETRC}"
    return found
