"""The deploy guide's loop, as a user writes it: an exported policy run by ONNX Runtime over a
vector env, reading everything it needs from the sidecar and importing nothing from rltrans."""

import json

import numpy as np
import onnxruntime as ort


def play(path, envs, episodes, seed=0):
    """(return, success) of the first ``episodes`` episodes the program plays in ``envs``."""
    meta = json.load(open(path + ".json"))  # noqa: SIM115 - the guide's one-liner
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    n, names = envs.num_envs, [t["name"] for t in meta["outputs"]]
    feeds = {t["name"]: np.full((n, *t["shape"][1:]), t["initial"], t["dtype"])
             for t in meta["inputs"] if t["role"] == "state"}  # fmt: skip
    target = [t["default"] for t in meta["inputs"] if t["role"] == "target_return"]
    obs, _ = envs.reset(seed=seed)
    start, reward, ret, ended = np.ones(n, bool), np.zeros(n, np.float32), np.zeros(n), []
    while len(ended) < episodes:
        feeds |= {"obs": np.asarray(obs, np.float32), "episode_start": start}
        if target:  # a return-conditioned policy: the last reward and the return to aim for
            feeds |= {"reward": reward, "target_return": np.full(n, target[0], np.float32)}
        out = dict(zip(names, session.run(names, feeds), strict=True))
        feeds |= {t["pairs"]: out[t["name"]] for t in meta["outputs"] if t["role"] == "state"}
        obs, reward, term, trunc, info = envs.step(out["action"])
        reward, start = np.asarray(reward, np.float32), np.asarray(term) | np.asarray(trunc)
        ret, won = ret + reward, np.asarray(info.get("success", start))
        ended += [(ret[i], bool(won[i])) for i in np.flatnonzero(start)]
        ret[start] = 0.0
    return ended[:episodes]
