"""hetero: run data-parallel work on fleets of different accelerators.

The public API is what ``__all__`` lists, made from one table, ``_EXPORTS`` (each public name and
the module that defines it); everything else is private and may change. Names load on first use,
so ``import hetero`` stays fast. Test doubles (an emulated fleet, a manual clock, an emulated
replica, fake NVML boxes) are in ``hetero.testing``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING as _TYPE_CHECKING

from hetero._lazy import lazy_exports
from hetero._version import __version__ as __version__

#: The public API: each name and the module that defines it (imported on first use).
_EXPORTS: dict[str, str] = {
    "recv": "hetero.comm",
    "send": "hetero.comm",
    "CommunicationConfig": "hetero.config",
    "DeviceConfig": "hetero.config",
    "HeteroConfig": "hetero.config",
    "LoggingConfig": "hetero.config",
    "ReplicaConfig": "hetero.config",
    "SchedulerConfig": "hetero.config",
    "load_config": "hetero.config",
    "parse_config": "hetero.config",
    "Catalog": "hetero.devices",
    "CatalogComparison": "hetero.devices",
    "Device": "hetero.devices",
    "DeviceKind": "hetero.devices",
    "DeviceSpec": "hetero.devices",
    "DeviceState": "hetero.devices",
    "DeviceType": "hetero.devices",
    "Topology": "hetero.devices",
    "build_fleet": "hetero.devices",
    "get_catalog": "hetero.devices",
    "get_device_list": "hetero.devices",
    "read_topology": "hetero.devices",
    "AllocationError": "hetero.errors",
    "BackendError": "hetero.errors",
    "ProviderError": "hetero.errors",
    "ConfigError": "hetero.errors",
    "DeviceError": "hetero.errors",
    "DuplicateItem": "hetero.errors",
    "DuplicateMember": "hetero.errors",
    "HeteroError": "hetero.errors",
    "InfeasiblePlan": "hetero.errors",
    "InvalidItem": "hetero.errors",
    "InvalidTransition": "hetero.errors",
    "ItemError": "hetero.errors",
    "ItemNotRunning": "hetero.errors",
    "MembershipError": "hetero.errors",
    "NoCapableDevice": "hetero.errors",
    "NoReplica": "hetero.errors",
    "QueueFull": "hetero.errors",
    "Rejected": "hetero.errors",
    "ServeError": "hetero.errors",
    "TaskFailed": "hetero.errors",
    "UnknownDevice": "hetero.errors",
    "UnknownItem": "hetero.errors",
    "UnknownMember": "hetero.errors",
    "UnknownModel": "hetero.errors",
    "set_log_level": "hetero.log",
    "Affinity": "hetero.plan",
    "Allocation": "hetero.plan",
    "AllocationEnd": "hetero.plan",
    "AllocationRequest": "hetero.plan",
    "AntiAffinity": "hetero.plan",
    "DevicePool": "hetero.plan",
    "EndCause": "hetero.plan",
    "FitRequest": "hetero.plan",
    "FleetPlan": "hetero.plan",
    "MemoryFit": "hetero.plan",
    "ModelShape": "hetero.plan",
    "PlanSpec": "hetero.plan",
    "Requirements": "hetero.plan",
    "ScoreWeights": "hetero.plan",
    "fit_memory": "hetero.plan",
    "get_model": "hetero.plan",
    "load_hf_config": "hetero.plan",
    "load_plan": "hetero.plan",
    "plan_fleet": "hetero.plan",
    "Backend": "hetero.runtime",
    "BatchOptions": "hetero.runtime",
    "Context": "hetero.runtime",
    "TaskFunction": "hetero.runtime",
    "TaskFuture": "hetero.runtime",
    "TaskOptions": "hetero.runtime",
    "checkpoint": "hetero.runtime",
    "get_current_device": "hetero.runtime",
    "get_memory_usage": "hetero.runtime",
    "restore": "hetero.runtime",
    "task": "hetero.runtime",
    "CostModel": "hetero.sched",
    "Dispatcher": "hetero.sched",
    "DispatchOptions": "hetero.sched",
    "FleetView": "hetero.sched",
    "ItemState": "hetero.sched",
    "ManualClock": "hetero.sched",
    "MonotonicClock": "hetero.sched",
    "PerfModel": "hetero.sched",
    "Policy": "hetero.sched",
    "WorkItem": "hetero.sched",
    "make_policy": "hetero.sched",
    "policy_names": "hetero.sched",
    "Router": "hetero.serve",
    "RouterOptions": "hetero.serve",
    "SimResult": "hetero.sim",
    "Simulator": "hetero.sim",
    "WorkloadSpec": "hetero.sim",
    "load_workload": "hetero.sim",
    "simulate": "hetero.sim",
    "Profile": "hetero.telemetry",
    "ProfileSummary": "hetero.telemetry",
    "TaskTrace": "hetero.telemetry",
    "HeteroSampler": "hetero.train",
    "format_size": "hetero.units",
    "parse_size": "hetero.units",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(["__version__", *_EXPORTS])

if _TYPE_CHECKING:
    # What type checkers read in place of the lazy look-up: ``_EXPORTS`` again, as explicit
    # re-exports. Nothing here runs; tests/test_public_api.py checks that both say the same.
    from hetero.comm import recv as recv
    from hetero.comm import send as send
    from hetero.config import CommunicationConfig as CommunicationConfig
    from hetero.config import DeviceConfig as DeviceConfig
    from hetero.config import HeteroConfig as HeteroConfig
    from hetero.config import LoggingConfig as LoggingConfig
    from hetero.config import ReplicaConfig as ReplicaConfig
    from hetero.config import SchedulerConfig as SchedulerConfig
    from hetero.config import load_config as load_config
    from hetero.config import parse_config as parse_config
    from hetero.devices import Catalog as Catalog
    from hetero.devices import CatalogComparison as CatalogComparison
    from hetero.devices import Device as Device
    from hetero.devices import DeviceKind as DeviceKind
    from hetero.devices import DeviceSpec as DeviceSpec
    from hetero.devices import DeviceState as DeviceState
    from hetero.devices import DeviceType as DeviceType
    from hetero.devices import Topology as Topology
    from hetero.devices import build_fleet as build_fleet
    from hetero.devices import get_catalog as get_catalog
    from hetero.devices import get_device_list as get_device_list
    from hetero.devices import read_topology as read_topology
    from hetero.errors import AllocationError as AllocationError
    from hetero.errors import BackendError as BackendError
    from hetero.errors import ConfigError as ConfigError
    from hetero.errors import DeviceError as DeviceError
    from hetero.errors import DuplicateItem as DuplicateItem
    from hetero.errors import DuplicateMember as DuplicateMember
    from hetero.errors import HeteroError as HeteroError
    from hetero.errors import InfeasiblePlan as InfeasiblePlan
    from hetero.errors import InvalidItem as InvalidItem
    from hetero.errors import InvalidTransition as InvalidTransition
    from hetero.errors import ItemError as ItemError
    from hetero.errors import ItemNotRunning as ItemNotRunning
    from hetero.errors import MembershipError as MembershipError
    from hetero.errors import NoCapableDevice as NoCapableDevice
    from hetero.errors import NoReplica as NoReplica
    from hetero.errors import ProviderError as ProviderError
    from hetero.errors import QueueFull as QueueFull
    from hetero.errors import Rejected as Rejected
    from hetero.errors import ServeError as ServeError
    from hetero.errors import TaskFailed as TaskFailed
    from hetero.errors import UnknownDevice as UnknownDevice
    from hetero.errors import UnknownItem as UnknownItem
    from hetero.errors import UnknownMember as UnknownMember
    from hetero.errors import UnknownModel as UnknownModel
    from hetero.log import set_log_level as set_log_level
    from hetero.plan import Affinity as Affinity
    from hetero.plan import Allocation as Allocation
    from hetero.plan import AllocationEnd as AllocationEnd
    from hetero.plan import AllocationRequest as AllocationRequest
    from hetero.plan import AntiAffinity as AntiAffinity
    from hetero.plan import DevicePool as DevicePool
    from hetero.plan import EndCause as EndCause
    from hetero.plan import FitRequest as FitRequest
    from hetero.plan import FleetPlan as FleetPlan
    from hetero.plan import MemoryFit as MemoryFit
    from hetero.plan import ModelShape as ModelShape
    from hetero.plan import PlanSpec as PlanSpec
    from hetero.plan import Requirements as Requirements
    from hetero.plan import ScoreWeights as ScoreWeights
    from hetero.plan import fit_memory as fit_memory
    from hetero.plan import get_model as get_model
    from hetero.plan import load_hf_config as load_hf_config
    from hetero.plan import load_plan as load_plan
    from hetero.plan import plan_fleet as plan_fleet
    from hetero.runtime import Backend as Backend
    from hetero.runtime import BatchOptions as BatchOptions
    from hetero.runtime import Context as Context
    from hetero.runtime import TaskFunction as TaskFunction
    from hetero.runtime import TaskFuture as TaskFuture
    from hetero.runtime import TaskOptions as TaskOptions
    from hetero.runtime import checkpoint as checkpoint
    from hetero.runtime import get_current_device as get_current_device
    from hetero.runtime import get_memory_usage as get_memory_usage
    from hetero.runtime import restore as restore
    from hetero.runtime import task as task
    from hetero.sched import CostModel as CostModel
    from hetero.sched import Dispatcher as Dispatcher
    from hetero.sched import DispatchOptions as DispatchOptions
    from hetero.sched import FleetView as FleetView
    from hetero.sched import ItemState as ItemState
    from hetero.sched import ManualClock as ManualClock
    from hetero.sched import MonotonicClock as MonotonicClock
    from hetero.sched import PerfModel as PerfModel
    from hetero.sched import Policy as Policy
    from hetero.sched import WorkItem as WorkItem
    from hetero.sched import make_policy as make_policy
    from hetero.sched import policy_names as policy_names
    from hetero.serve import Router as Router
    from hetero.serve import RouterOptions as RouterOptions
    from hetero.sim import SimResult as SimResult
    from hetero.sim import Simulator as Simulator
    from hetero.sim import WorkloadSpec as WorkloadSpec
    from hetero.sim import load_workload as load_workload
    from hetero.sim import simulate as simulate
    from hetero.telemetry import Profile as Profile
    from hetero.telemetry import ProfileSummary as ProfileSummary
    from hetero.telemetry import TaskTrace as TaskTrace
    from hetero.train import HeteroSampler as HeteroSampler
    from hetero.units import format_size as format_size
    from hetero.units import parse_size as parse_size
