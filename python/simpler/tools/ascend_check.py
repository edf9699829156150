"""A hardware check for Ascend machines: raw answers of the CANN runtime and HAL that decide how
simpler maps, unregisters and keeps sessions, printed as one JSON object to send back.

``python -m simpler.tools.ascend_check [--lib-dir DIR] [--device N] [--out FILE]``

It calls the vendor libraries directly (ctypes), not through simpler's driver, so the codes are
the vendor's own:

* ``map_sizes`` — ``halHostRegister(DEV_SVM_MAP_HOST)`` of fresh 1 B, 33 B, 4 KiB+1 and 1 MiB+1
  allocations: the code of each, and of its unregister;
* ``map_until_refusal`` — 64 MiB allocations mapped one after another until the HAL refuses
  (or 64 of them): how many were mapped, the bytes, and the refusing code;
* ``unregister_devid`` — with ``ASCEND_RT_VISIBLE_DEVICES=1,2`` (a child process): one mapping
  unregistered with the user id first, then with the logical id, and the codes;
* ``context_after_reopen`` — the current context of a thread bound to the device, after the
  device was reset and set again: whether the handle is the same object;
* ``open_close_cycles`` — the time of 10 cycles of ``aclInit`` + ``aclrtSetDevice`` +
  ``aclrtResetDevice`` + ``aclFinalizeReference``.

Libraries come from ``--lib-dir`` (or ``SIMPLER_ASCEND_LIB_DIR``), else from the loader's path
(source the toolkit's ``set_env.sh`` first). ``make test`` runs it against the fake runtime.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

DEV_SVM_MAP_HOST = 2


class Acl:
    """The few runtime and HAL entry points the check calls."""

    def __init__(self, lib_dir: str | None):
        def load(name: str) -> ctypes.CDLL:
            path = os.path.join(lib_dir, name) if lib_dir else name
            dep = os.path.join(lib_dir, "libc_sec.so") if lib_dir else ""
            if dep and os.path.exists(dep):
                ctypes.CDLL(dep, mode=ctypes.RTLD_GLOBAL)
            return ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)

        self.hal = load("libascend_hal.so")
        self.rt = load("libascendcl.so")
        vp = ctypes.c_void_p
        self.hal.halHostRegister.argtypes = [
            vp,
            ctypes.c_uint64,
            ctypes.c_uint32,
            ctypes.c_uint32,
            ctypes.POINTER(vp),
        ]
        self.hal.halHostUnregister.argtypes = [vp, ctypes.c_uint32]
        self.rt.aclrtMalloc.argtypes = [ctypes.POINTER(vp), ctypes.c_size_t, ctypes.c_int]
        self.rt.aclrtFree.argtypes = [vp]
        self.rt.aclrtGetCurrentContext.argtypes = [ctypes.POINTER(vp)]
        self.rt.aclFinalizeReference.argtypes = [ctypes.POINTER(ctypes.c_uint64)]
        self.rt.aclrtGetLogicDevIdByUserDevId.argtypes = [ctypes.c_int32, ctypes.POINTER(ctypes.c_int32)]

    def open(self, device: int) -> list[int]:
        return [self.rt.aclInit(None), self.rt.aclrtSetDevice(device)]

    def close(self, device: int) -> list[int]:
        left = ctypes.c_uint64()
        return [self.rt.aclrtResetDevice(device), self.rt.aclFinalizeReference(ctypes.byref(left))]

    def malloc(self, size: int) -> tuple[int, int]:
        p = ctypes.c_void_p()
        code = self.rt.aclrtMalloc(ctypes.byref(p), size, 0)
        return code, p.value or 0

    def register(self, ptr: int, size: int, devid: int) -> int:
        host = ctypes.c_void_p()
        return self.hal.halHostRegister(ptr, size, DEV_SVM_MAP_HOST, devid, ctypes.byref(host))

    def logical(self, user: int) -> int:
        out = ctypes.c_int32(-1)
        code = self.rt.aclrtGetLogicDevIdByUserDevId(user, ctypes.byref(out))
        return out.value if code == 0 else user

    def context(self) -> int:
        ctx = ctypes.c_void_p()
        code = self.rt.aclrtGetCurrentContext(ctypes.byref(ctx))
        return ctx.value or 0 if code == 0 else 0


def map_sizes(acl: Acl, device: int) -> list[dict[str, Any]]:
    devid = acl.logical(device)
    out = []
    for size in (1, 33, 4096 + 1, (1 << 20) + 1):
        code, p = acl.malloc(size)
        row: dict[str, Any] = {"bytes": size, "malloc": code}
        if code == 0:
            row["register"] = acl.register(p, size, devid)
            row["unregister"] = acl.hal.halHostUnregister(p, devid) if row["register"] == 0 else None
            acl.rt.aclrtFree(p)
        out.append(row)
    return out


def map_until_refusal(acl: Acl, device: int, chunk: int = 64 << 20, limit: int = 64) -> dict[str, Any]:
    devid = acl.logical(device)
    mapped: list[int] = []
    held: list[int] = []
    refusal = None
    for _ in range(limit):
        code, p = acl.malloc(chunk)
        if code != 0:
            refusal = {"call": "aclrtMalloc", "code": code}
            break
        held.append(p)
        code = acl.register(p, chunk, devid)
        if code != 0:
            refusal = {"call": "halHostRegister", "code": code}
            break
        mapped.append(p)
    for p in mapped:
        acl.hal.halHostUnregister(p, devid)
    for p in held:
        acl.rt.aclrtFree(p)
    return {
        "chunk_bytes": chunk,
        "mapped": len(mapped),
        "mapped_bytes": len(mapped) * chunk,
        "refusal": refusal,
    }


def unregister_devid(lib_dir: str | None) -> dict[str, Any]:
    """In a child with ASCEND_RT_VISIBLE_DEVICES=1,2: user device 0 is logical device 1."""
    env = dict(os.environ, ASCEND_RT_VISIBLE_DEVICES="1,2")
    args = [sys.executable, "-m", "simpler.tools.ascend_check", "--unregister-child"]
    if lib_dir:
        args += ["--lib-dir", lib_dir]
    out = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120)
    try:
        return json.loads(out.stdout)
    except json.JSONDecodeError:
        return {"error": (out.stderr or out.stdout)[-2000:]}


def _unregister_child(acl: Acl) -> dict[str, Any]:
    opened = acl.open(0)
    logical = acl.logical(0)
    code, p = acl.malloc(2 << 20)
    row: dict[str, Any] = {"open": opened, "user": 0, "logical": logical, "malloc": code}
    if code == 0:
        row["register_logical"] = acl.register(p, 2 << 20, logical)
        row["unregister_user"] = acl.hal.halHostUnregister(p, 0)
        row["unregister_logical"] = acl.hal.halHostUnregister(p, logical)
        acl.rt.aclrtFree(p)
    row["close"] = acl.close(0)
    return row


def context_after_reopen(acl: Acl, device: int) -> dict[str, Any]:
    seen: dict[str, int] = {}

    def bound() -> None:
        seen["before"] = acl.context()

    acl.open(device)
    first = acl.context()
    # The tuple only sequences the two calls; its value is dropped.
    t = threading.Thread(target=lambda: (acl.rt.aclrtSetCurrentContext(ctypes.c_void_p(first)), bound()))  # type: ignore[func-returns-value]
    t.start()
    t.join()
    acl.close(device)
    after_close = acl.context()
    acl.open(device)
    second = acl.context()
    acl.close(device)
    return {
        "first": hex(first),
        "after_close": hex(after_close),
        "reopened": hex(second),
        "same_object": first == second,
        "other_thread_bound": hex(seen.get("before", 0)),
    }


def open_close_cycles(acl: Acl, device: int, n: int = 10) -> dict[str, Any]:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        acl.open(device)
        acl.close(device)
        times.append(time.perf_counter() - t0)
    return {"cycles": n, "seconds": [round(t, 6) for t in times], "total_s": round(sum(times), 6)}


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``python -m simpler.tools.ascend_check``."""
    p = argparse.ArgumentParser(prog="python -m simpler.tools.ascend_check", description=__doc__)
    p.add_argument("--lib-dir", default=os.environ.get("SIMPLER_ASCEND_LIB_DIR") or None)
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--out", help="also write the JSON here")
    p.add_argument("--unregister-child", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    acl = Acl(a.lib_dir)
    if a.unregister_child:
        print(json.dumps(_unregister_child(acl)))
        return
    result: dict[str, Any] = {"lib_dir": a.lib_dir, "device": a.device}
    result["open"] = acl.open(a.device)
    result["map_sizes"] = map_sizes(acl, a.device)
    result["map_until_refusal"] = map_until_refusal(acl, a.device)
    result["close"] = acl.close(a.device)
    result["unregister_devid"] = unregister_devid(a.lib_dir)
    result["context_after_reopen"] = context_after_reopen(acl, a.device)
    result["open_close_cycles"] = open_close_cycles(acl, a.device)
    text = json.dumps(result, indent=1)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
