"""Is this machine an EC2 instance? Asked of the kernel, never of the network.

AWS documents how to tell ("Detect whether a host is an EC2 instance"; cloud-init's
``ds-identify`` and ``amazon-ec2-utils`` do the same): on Nitro instances the DMI vendor
(``/sys/devices/virtual/dmi/id/board_vendor`` or ``sys_vendor``) is ``Amazon EC2``; on
older Xen instances ``/sys/hypervisor/uuid`` starts with ``ec2``. Reading two or three
tiny sysfs files sends nothing anywhere, so callers use this to decide whether the
instance metadata service (169.254.169.254) may be asked at all.
"""

from __future__ import annotations

from pathlib import Path

DMI_DIR = Path("/sys/devices/virtual/dmi/id")
HYPERVISOR_UUID = Path("/sys/hypervisor/uuid")
EC2_DMI_VENDOR = "Amazon EC2"


def is_ec2(dmi_dir: Path = DMI_DIR, hypervisor_uuid: Path = HYPERVISOR_UUID) -> bool:
    """Whether this machine is an EC2 instance, from what the kernel exposes.

    Reads two or three tiny sysfs files; sends nothing anywhere.
    """
    for name in ("board_vendor", "sys_vendor"):
        try:
            if (dmi_dir / name).read_text(errors="replace").strip() == EC2_DMI_VENDOR:
                return True
        except OSError:
            continue
    try:
        return hypervisor_uuid.read_text(errors="replace").strip().lower().startswith("ec2")
    except OSError:
        return False
