"""Heterogeneous training on torch.distributed: data parallelism, where each rank takes a share
of every global batch in proportion to its speed and the update is still the global batch's;
and pipeline parallelism, where each rank runs contiguous layers sized by its speed and memory.

Needs the ``torch`` extra; names load on first use, so ``import hetero.train`` alone is cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hetero._lazy import lazy_exports

#: Each public name and the module that defines it (imported on first use).
_EXPORTS: dict[str, str] = {
    "AttentionLayout": "hetero.train.tensor_parallel",
    "BlockLayout": "hetero.train.tensor_parallel",
    "CheckpointCopies": "hetero.train.checkpoint",
    "DataPipelineRunner": "hetero.train.pipeline_parallel",
    "ExpertParallelMoE": "hetero.train.expert_parallel",
    "ExpertPlacement": "hetero.train.expert_placement",
    "ExpertRank": "hetero.train.expert_placement",
    "FleetLayout": "hetero.train.fleet_layout",
    "GradientRange": "hetero.train.fleet_layout",
    "HeteroSampler": "hetero.train.sampler",
    "LAYER_KINDS": "hetero.train.tensor_parallel",
    "LayerCost": "hetero.train.stages",
    "LayoutOption": "hetero.train.fleet_layout",
    "MLPLayout": "hetero.train.tensor_parallel",
    "MemoryEstimate": "hetero.train.memory",
    "MixtureOfExperts": "hetero.train.expert_parallel",
    "PipelineRank": "hetero.train.stages",
    "PipelineReplica": "hetero.train.fleet_layout",
    "PipelineRunner": "hetero.train.pipeline_parallel",
    "PipelineStepReport": "hetero.train.pipeline_parallel",
    "RankReport": "hetero.train.report",
    "RayTrainRun": "hetero.train.ray_train",
    "Stage": "hetero.train.stages",
    "StagePlan": "hetero.train.stages",
    "StepReport": "hetero.train.report",
    "Trainer": "hetero.train.trainer",
    "TrainerOptions": "hetero.train.options",
    "TrainerParts": "hetero.train.ray_train",
    "WorkerDevice": "hetero.train.ray_train",
    "choose_layout": "hetero.train.fleet_layout",
    "given_layout": "hetero.train.fleet_layout",
    "mark_progress": "hetero.train.heartbeat_sender",
    "parameter_bytes": "hetero.train.tensor_parallel",
    "pipeline_ranks": "hetero.train.fleet_ranks",
    "place_experts": "hetero.train.expert_placement",
    "place_experts_evenly": "hetero.train.expert_placement",
    "plan_stages": "hetero.train.stages",
    "profile_layers": "hetero.train.layer_profile",
    "ray_trainer": "hetero.train.ray_train",
    "reduce_dense_gradients": "hetero.train.expert_parallel",
    "run_on_ray": "hetero.train.ray_train",
    "split_layers": "hetero.train.stages",
    "tensor_parallel": "hetero.train.tensor_parallel",
    "tensor_parallel_groups": "hetero.train.tensor_parallel_groups",
    "tensor_parallel_mesh": "hetero.train.tensor_parallel_groups",
    "tensor_parallel_plan": "hetero.train.tensor_parallel",
    "training_layer_costs": "hetero.train.model_costs",
    "worker_devices": "hetero.train.ray_train",
    "write_training_report": "hetero.train.report_html",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    # What type checkers read in place of the lazy look-up: ``_EXPORTS`` again, as explicit
    # re-exports. Nothing here runs; tests/test_public_api.py checks that both say the same.
    from hetero.train.checkpoint import CheckpointCopies as CheckpointCopies
    from hetero.train.expert_parallel import ExpertParallelMoE as ExpertParallelMoE
    from hetero.train.expert_parallel import MixtureOfExperts as MixtureOfExperts
    from hetero.train.expert_parallel import reduce_dense_gradients as reduce_dense_gradients
    from hetero.train.expert_placement import ExpertPlacement as ExpertPlacement
    from hetero.train.expert_placement import ExpertRank as ExpertRank
    from hetero.train.expert_placement import place_experts as place_experts
    from hetero.train.expert_placement import place_experts_evenly as place_experts_evenly
    from hetero.train.fleet_layout import FleetLayout as FleetLayout
    from hetero.train.fleet_layout import GradientRange as GradientRange
    from hetero.train.fleet_layout import LayoutOption as LayoutOption
    from hetero.train.fleet_layout import PipelineReplica as PipelineReplica
    from hetero.train.fleet_layout import choose_layout as choose_layout
    from hetero.train.fleet_layout import given_layout as given_layout
    from hetero.train.fleet_ranks import pipeline_ranks as pipeline_ranks
    from hetero.train.heartbeat_sender import mark_progress as mark_progress
    from hetero.train.layer_profile import profile_layers as profile_layers
    from hetero.train.memory import MemoryEstimate as MemoryEstimate
    from hetero.train.model_costs import training_layer_costs as training_layer_costs
    from hetero.train.options import TrainerOptions as TrainerOptions
    from hetero.train.pipeline_parallel import DataPipelineRunner as DataPipelineRunner
    from hetero.train.pipeline_parallel import PipelineRunner as PipelineRunner
    from hetero.train.pipeline_parallel import PipelineStepReport as PipelineStepReport
    from hetero.train.ray_train import RayTrainRun as RayTrainRun
    from hetero.train.ray_train import TrainerParts as TrainerParts
    from hetero.train.ray_train import WorkerDevice as WorkerDevice
    from hetero.train.ray_train import ray_trainer as ray_trainer
    from hetero.train.ray_train import run_on_ray as run_on_ray
    from hetero.train.ray_train import worker_devices as worker_devices
    from hetero.train.report import RankReport as RankReport
    from hetero.train.report import StepReport as StepReport
    from hetero.train.report_html import write_training_report as write_training_report
    from hetero.train.sampler import HeteroSampler as HeteroSampler
    from hetero.train.stages import LayerCost as LayerCost
    from hetero.train.stages import PipelineRank as PipelineRank
    from hetero.train.stages import Stage as Stage
    from hetero.train.stages import StagePlan as StagePlan
    from hetero.train.stages import plan_stages as plan_stages
    from hetero.train.stages import split_layers as split_layers
    from hetero.train.tensor_parallel import LAYER_KINDS as LAYER_KINDS
    from hetero.train.tensor_parallel import AttentionLayout as AttentionLayout
    from hetero.train.tensor_parallel import BlockLayout as BlockLayout
    from hetero.train.tensor_parallel import MLPLayout as MLPLayout
    from hetero.train.tensor_parallel import parameter_bytes as parameter_bytes
    from hetero.train.tensor_parallel import tensor_parallel as tensor_parallel
    from hetero.train.tensor_parallel import tensor_parallel_plan as tensor_parallel_plan
    from hetero.train.tensor_parallel_groups import tensor_parallel_groups as tensor_parallel_groups
    from hetero.train.tensor_parallel_groups import tensor_parallel_mesh as tensor_parallel_mesh
    from hetero.train.trainer import Trainer as Trainer
