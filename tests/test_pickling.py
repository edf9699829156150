"""Reports and the library's exceptions cross processes as themselves: each pickles and reads
back with every field it carries (a device group's children send them to the caller)."""

import pickle

import numpy as np
import pytest

import simpler as sp
from simpler import errors
from simpler.group import DeviceGroupError, RemoteError


def _acc_callable():
    work = sp.KernelWork(flops={"bf16": 64})
    k = sp.Kernel(lambda w, acc: np.add(acc, w, out=acc), [sp.IN, sp.INOUT], name="acc", work=work)
    return sp.Callable(lambda o, w, acc: o.submit(k, w, acc), [sp.IN, sp.INOUT], name="acc")


def _roundtrip(obj):
    return pickle.loads(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


@pytest.mark.parametrize("model", [None, "ascend-a3,h200"])
def test_a_run_report_pickles_and_reads_back_with_every_field(model):
    with sp.Worker("sim", model=model) as w:
        report = w.run(_acc_callable(), [np.ones(8, np.float32), np.zeros(8, np.float32)])
    back = _roundtrip(report)
    assert type(back) is sp.RunReport
    assert back.to_dict() == report.to_dict()
    for name in ("callable", "ok", "dispatch_ns", "modeled_dispatch_ns", "modeled_round_ns"):
        assert getattr(back, name) == getattr(report, name), name
    assert back.modeled_by == report.modeled_by and back.kernels == report.kernels
    assert repr(back) == repr(report)
    if model is not None:  # the modeled parts are there to compare
        assert list(back.modeled_by) == ["ascend-a3", "h200"] and back.kernels[0]["kernel"] == "acc"


def test_a_report_is_not_restored_from_bytes_it_did_not_write():
    with pytest.raises(sp.ArgumentError, match="not the bytes of a run report"):
        sp.RunReport._restore("acc", b"\x00" * 7)


@pytest.mark.parametrize("name", errors.__all__)
def test_each_library_exception_pickles_with_its_class_message_and_attributes(name):
    cls = getattr(errors, name)
    e = cls("what went wrong")
    e.addr = 0x1000
    e.__notes__ = ["a note"]
    back = _roundtrip(e)
    assert type(back) is cls and back.args == ("what went wrong",)
    assert back.addr == 0x1000 and back.__notes__ == ["a note"]


def test_a_device_error_of_a_failed_driver_call_pickles_with_the_call_it_names():
    with sp.Worker("sim") as w:
        w.inject_fault("alloc")
        with pytest.raises(sp.DeviceError) as ei:
            w.malloc(64)
    e = ei.value
    back = _roundtrip(e)
    assert type(back) is sp.DeviceError and str(back) == str(e)
    fields = ("op", "code", "code_name", "call", "phase", "tensor", "addr", "nbytes")
    assert {f: getattr(back, f) for f in fields} == {f: getattr(e, f) for f in fields}
    assert back.op == "alloc"


def test_the_group_errors_pickle_with_their_fields():
    d = _roundtrip(DeviceGroupError("device 1 died", 1, "round"))
    assert type(d) is DeviceGroupError and (str(d), d.device, d.phase) == ("device 1 died", 1, "round")
    text = "device 1 (round): boom [RuntimeError]"
    r = _roundtrip(RemoteError(text, "RuntimeError", 1, "round"))
    assert type(r) is RemoteError and (str(r), r.kind, r.device, r.phase) == (
        text,
        "RuntimeError",
        1,
        "round",
    )


def test_a_library_error_that_cannot_pickle_crosses_as_a_remote_error_naming_its_type():
    import threading

    from simpler.group._errors import crossing

    e = sp.StateError("busy")
    e.lock = threading.Lock()  # an attribute pickle refuses
    out, trace = crossing(e)
    assert type(out) is RemoteError and (str(out), out.kind) == ("busy", "StateError")
    assert "StateError: busy" in trace
    same, _ = crossing(sp.StateError("busy"))
    assert type(same) is sp.StateError
