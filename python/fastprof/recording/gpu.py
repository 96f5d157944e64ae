"""GPU inventory for the trace metadata, through ``pynvml`` (nvidia-ml-py).

The Rust sampler reads NVML on its own thread; this only records what the
devices are (name, UUID, driver, power limit, memory) once at start. No
driver or no library is a normal state, reported with its reason.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def inventory() -> dict[str, Any]:
    try:
        import pynvml
    except ImportError as e:
        return {"available": False, "reason": f"pynvml not importable: {e}"}
    try:
        pynvml.nvmlInit()
    except Exception as e:  # noqa: BLE001 - every NVML failure means "unavailable"
        return {"available": False, "reason": f"{type(e).__name__}: {e}"}
    try:
        devices = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            dev: dict[str, Any] = {"index": i}
            fields: tuple[tuple[str, Callable[[Any], Any]], ...] = (
                ("name", pynvml.nvmlDeviceGetName),
                ("uuid", pynvml.nvmlDeviceGetUUID),
                ("power_limit_w", lambda d: pynvml.nvmlDeviceGetEnforcedPowerLimit(d) / 1000.0),
                ("memory_total_bytes", lambda d: pynvml.nvmlDeviceGetMemoryInfo(d).total),
            )
            for key, read in fields:
                try:
                    value = read(h)
                    dev[key] = value.decode() if isinstance(value, bytes) else value
                except Exception as e:  # noqa: BLE001 - one field missing is fine
                    dev[key] = None
                    dev.setdefault("errors", {})[key] = str(e)
            devices.append(dev)
        driver = pynvml.nvmlSystemGetDriverVersion()
        return {
            "available": True,
            "driver": driver.decode() if isinstance(driver, bytes) else driver,
            "devices": devices,
        }
    except Exception as e:  # noqa: BLE001
        return {"available": False, "reason": f"{type(e).__name__}: {e}"}
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass
