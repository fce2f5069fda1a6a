"""``mnistflow doctor``: what this machine is, what is installed, and what to change."""
from __future__ import annotations

import importlib.util
import os
import platform


def _has(mod: str) -> bool:
    return importlib.util.find_spec(mod) is not None


def diagnose() -> dict:
    """Facts about the environment and concrete recommendations (a dict, for --json)."""
    import torch

    from mnistflow import kernels
    from mnistflow.core.paths import home
    from mnistflow.runtime.cpu import cpu_flags, cpu_has_fast_bf16, usable_cores

    kernels.library()  # builds and loads them if it can; reason() then says how that went
    facts: dict = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_build": "CUDA " + torch.version.cuda if torch.version.cuda else "CPU only",
        "cuda_available": torch.cuda.is_available(),
        "cpu": _cpu_model(),
        "cpu_features": sorted(f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
                               if f in cpu_flags()),
        "cores": usable_cores(),
        "torch_threads": torch.get_num_threads(),
        "omp_wait_policy": _omp_wait_policy(),
        "native_kernels": kernels.reason(),
        "amx_kernels": kernels.amx_reason(),
        "bf16_kernels": kernels.bf16_reason(),
        "mnistflow_home": str(home()),
        "mnistflow_data": os.environ.get("MNISTFLOW_DATA", "(unset)"),
        "optional": {"tensorboard": _has("tensorboard"), "onnxruntime": _has("onnxruntime"),
                     "onnx": _has("onnx"), "serve (starlette, uvicorn)": _has("starlette") and _has("uvicorn"),
                     "matplotlib": _has("matplotlib")},
        "gpus": [],
    }
    if torch.cuda.is_available():
        facts["cudnn"] = torch.backends.cudnn.version()
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            facts["gpus"].append({"index": i, "name": p.name, "memory_gb": round(p.total_memory / 2**30, 1),
                                  "capability": f"{p.major}.{p.minor}", "bf16": torch.cuda.is_bf16_supported()})
        try:
            torch.zeros(1, device="cuda")
            facts["cuda_driver_ok"] = True
        except RuntimeError as e:
            facts["cuda_driver_ok"] = False
            facts["cuda_error"] = str(e).splitlines()[0]
    recs = []
    if facts["gpus"]:
        recs.append("a GPU is present: mnistflow uses it by default (--device auto); data stays resident on it")
        if facts["gpus"][0]["bf16"]:
            recs.append("the GPU supports bf16: --precision auto picks bf16")
        if facts.get("cuda_driver_ok") is False:
            recs.append("CUDA failed to initialise: the driver does not match this torch build "
                        f"({facts['torch_build']}); install a matching torch or driver")
    elif cpu_has_fast_bf16():
        recs.append("bf16 is fast on this CPU (AMX/AVX-512-BF16): use --precision bf16 (auto does) "
                    "and --channels-last for conv nets")
    else:
        recs.append("no fast bf16 on this CPU: --precision auto stays fp32")
    cores = facts["cores"]
    recs.append(f"{cores} core(s): use --threads {cores} on an idle machine (fewer when other processes "
                "are busy: oversubscribed threads can be several times slower); no loader workers are needed "
                "(the data is resident)")
    if facts["omp_wait_policy"].startswith("(unset"):
        recs.append("torch was imported before mnistflow, so its OpenMP threads spin while they wait: import "
                    "mnistflow first (it lets them sleep when other processes are running), or set "
                    "OMP_WAIT_POLICY=PASSIVE before starting; spinning threads collapse when another process "
                    "holds a core")
    if not facts["native_kernels"].startswith(("loaded", "off")):
        recs.append("install a C compiler with OpenMP (Debian: apt-get install gcc) for mnistflow's native "
                    "CPU kernels (max-pool, batch norm + ReLU, and on AMX or AVX-512-BF16 CPUs the convolutions' weight gradient and "
                    "Muon's orthogonalization): the fast recipe trains ~1.5x faster with them (BENCHMARKS.md)")
    if not facts["optional"]["tensorboard"]:
        recs.append("pip install tensorboard to get event files")
    if not facts["optional"]["onnxruntime"]:
        recs.append("pip install 'mnistflow[onnx]' for ONNX export")
    if facts["mnistflow_data"] == "(unset)" and not (home() / "raw" / "mnist").is_dir():
        recs.append("MNIST is neither in $MNISTFLOW_DATA nor in the cache: the first prep downloads it")
    facts["recommendations"] = recs
    return facts


def _omp_wait_policy() -> str:
    """OpenMP's wait policy in this process and who chose it (``core.openmp`` chooses, by the
    load when mnistflow was imported, unless the user chose or torch was loaded before mnistflow:
    then libgomp's default holds)."""
    from mnistflow.core import openmp

    policy = os.environ.get("OMP_WAIT_POLICY", "").strip()
    spin = os.environ.get("GOMP_SPINCOUNT", "").strip()
    chosen = openmp.chosen
    if chosen == "passive":
        return f"{policy} (mnistflow's choice: other processes were running when it started)"
    if chosen == "spin":
        return "libgomp's default, spin ~300k rounds, then sleep (mnistflow's choice: the machine was idle)"
    if policy or spin:
        return " ".join(x for x in (policy, spin and f"GOMP_SPINCOUNT={spin}") if x) + " (yours)"
    return "(unset: torch was imported before mnistflow; libgomp spins ~300k rounds, then sleeps)"


def _cpu_model() -> str:
    from mnistflow.runtime.cpu import cpu_info

    return cpu_info().get("model name") or platform.processor() or "unknown"


def format_report(d: dict) -> str:
    rows = [("Python", d["python"]), ("PyTorch", f"{d['torch']} ({d['torch_build']})"),
            ("CUDA available", str(d["cuda_available"]))]
    if "cudnn" in d:
        rows.append(("cuDNN", str(d["cudnn"])))
    for g in d["gpus"]:
        rows.append((f"GPU {g['index']}", f"{g['name']}, {g['memory_gb']} GB, sm {g['capability']}"))
    rows += [("CPU", d["cpu"]), ("CPU features", " ".join(d["cpu_features"]) or "-"),
             ("cores / threads", f"{d['cores']} / {d['torch_threads']}"),
             ("OMP_WAIT_POLICY", d["omp_wait_policy"]), ("native kernels", d["native_kernels"]),
             ("AMX kernels", d["amx_kernels"]), ("weight gradient, Muon", d["bf16_kernels"]),
             ("data", d["mnistflow_data"]), ("cache", d["mnistflow_home"])]
    rows += [(f"  {k}", "installed" if v else "missing") for k, v in d["optional"].items()]
    w = max(len(k) for k, _ in rows)
    out = [f"{k:<{w}}  {v}" for k, v in rows]
    out += ["", "recommendations:"] + [f"- {r}" for r in d["recommendations"]]
    return "\n".join(out)
