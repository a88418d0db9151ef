# ActiveKV's vLLM connector: the one Python file of the activekv wheel.
#
# vLLM requires its connector to be a Python subclass of KVConnectorBase_V1, so this file is that
# subclass and nothing more: it holds one native ConnectorCore (activekv._vllm) and forwards every
# hook to it in one call. Each line that is not blank or a comment cites the vLLM source line that
# requires it, once in each vLLM release the connector supports (0.32.0 and 0.33.0); the citation
# format is documented in release/gates/citations.py and the payload gate verifies every citation
# against each pinned vLLM wheel (manifests/activekv.toml, payload.shims).
from typing import TYPE_CHECKING, Any  # cites: vllm==0.32.0 vllm/distributed/kv_transfer/kv_connector/v1/base.py:47 b222aa97; vllm==0.33.0 vllm/distributed/kv_transfer/kv_connector/v1/base.py:47 b222aa97

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1  # cites: vllm==0.32.0 vllm/distributed/kv_transfer/kv_connector/v1/base.py:180 9433fb97; vllm==0.33.0 vllm/distributed/kv_transfer/kv_connector/v1/base.py:181 9433fb97
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata  # cites: vllm==0.32.0 vllm/distributed/kv_transfer/kv_connector/v1/base.py:582 c98aeefb; vllm==0.33.0 vllm/distributed/kv_transfer/kv_connector/v1/base.py:597 c98aeefb

from activekv._vllm import ConnectorCore  # cites: vllm==0.32.0 vllm/distributed/kv_transfer/kv_connector/factory.py:37 c4d08c46; vllm==0.33.0 vllm/distributed/kv_transfer/kv_connector/factory.py:37 c4d08c46

if TYPE_CHECKING:  # cites: vllm==0.32.0 vllm/distributed/kv_transfer/kv_connector/v1/base.py:57 d5631711; vllm==0.33.0 vllm/distributed/kv_transfer/kv_connector/v1/base.py:57 d5631711
    import torch  # cites: vllm==0.32.0 vllm/distributed/kv_transfer/kv_connector/v1/base.py:49 cf1070d3; vllm==0.33.0 vllm/distributed/kv_transfer/kv_connector/v1/base.py:49 cf1070d3
    from vllm.config import VllmConfig  # cites: vllm==0.32.0 vllm/distributed/kv_transfer/kv_connector/v1/base.py:58 5e9ef1c5; vllm==0.33.0 vllm/distributed/kv_transfer/kv_connector/v1/base.py:58 5e9ef1c5
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # cites: vllm==0.32.0 vllm/distributed/kv_transfer/kv_connector/v1/base.py:211 b1e25e12; vllm==0.33.0 vllm/distributed/kv_transfer/kv_connector/v1/base.py:217 b1e25e12
    from vllm.forward_context import ForwardContext  # cites: vllm==0.32.0 vllm/distributed/kv_transfer/kv_connector/v1/base.py:66 3444bb1c; vllm==0.33.0 vllm/distributed/kv_transfer/kv_connector/v1/base.py:67 3444bb1c
    from vllm.v1.attention.backend import AttentionMetadata  # cites: vllm==0.32.0 vllm/distributed/kv_transfer/kv_connector/v1/base.py:52 f3caa651; vllm==0.33.0 vllm/distributed/kv_transfer/kv_connector/v1/base.py:52 f3caa651
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks  # cites: vllm==0.32.0 vllm/distributed/kv_transfer/kv_connector/v1/base.py:68 98d69a23; vllm==0.33.0 vllm/distributed/kv_transfer/kv_connector/v1/base.py:69 98d69a23
    from vllm.v1.core.sched.output import SchedulerOutput  # cites: vllm==0.32.0 vllm/distributed/kv_transfer/kv_connector/v1/base.py:53 44152229; vllm==0.33.0 vllm/distributed/kv_transfer/kv_connector/v1/base.py:53 44152229
    from vllm.v1.kv_cache_interface import KVCacheConfig  # cites: vllm==0.32.0 vllm/distributed/kv_transfer/kv_connector/v1/base.py:69 d0797eba; vllm==0.33.0 vllm/distributed/kv_transfer/kv_connector/v1/base.py:70 d0797eba
    from vllm.v1.request import Request  # cites: vllm==0.32.0 vllm/distributed/kv_transfer/kv_connector/v1/base.py:70 9f3f23d4; vllm==0.33.0 vllm/distributed/kv_transfer/kv_connector/v1/base.py:71 9f3f23d4


# The step's plan as build_connector_meta must return it, a KVConnectorMetadata: the native core
# makes it and sets its `plan` (activekv._vllm.StepPlan), so it pickles to worker processes.
class ActiveKVMetadata(KVConnectorMetadata): pass  # cites: vllm==0.32.0 vllm/distributed/kv_transfer/kv_connector/v1/base.py:154 e91c88e4; vllm==0.33.0 vllm/distributed/kv_transfer/kv_connector/v1/base.py:155 e91c88e4


class ActiveKVConnector(KVConnectorBase_V1):  # cites: vllm==0.32.0 vllm/distributed/kv_transfer/kv_connector/factory.py:38 eb82af68; vllm==0.33.0 vllm/distributed/kv_transfer/kv_connector/factory.py:38 eb82af68
    def __init__(self, vllm_config: "VllmConfig", role: "KVConnectorRole", kv_cache_config: "KVCacheConfig") -> None:  # cites: vllm==0.32.0 vllm/distributed/kv_transfer/kv_connector/v1/base.py:208 29b36ada; vllm==0.33.0 vllm/distributed/kv_transfer/kv_connector/v1/base.py:214 29b36ada
        super().__init__(vllm_config, role, kv_cache_config)  # cites: vllm==0.32.0 vllm/distributed/kv_transfer/kv_connector/factory.py:121 093d5e65; vllm==0.33.0 vllm/distributed/kv_transfer/kv_connector/factory.py:121 093d5e65
        self._core = ConnectorCore(vllm_config, role, kv_cache_config)  # cites: vllm==0.32.0 vllm/distributed/kv_transfer/kv_connector/factory.py:75 fe8b1a14; vllm==0.33.0 vllm/distributed/kv_transfer/kv_connector/factory.py:75 fe8b1a14

    # Scheduler half.

    def get_num_new_matched_tokens(self, request: "Request", num_computed_tokens: int) -> tuple[int | None, bool]:  # cites: vllm==0.32.0 vllm/distributed/kv_transfer/kv_connector/v1/base.py:501 6410c38f; vllm==0.33.0 vllm/distributed/kv_transfer/kv_connector/v1/base.py:516 6410c38f
        return self._core.get_num_new_matched_tokens(request, num_computed_tokens)  # cites: vllm==0.32.0 vllm/v1/core/sched/scheduler.py:979 8514600a; vllm==0.33.0 vllm/v1/core/sched/scheduler.py:1139 8514600a

    def update_state_after_alloc(self, request: "Request", blocks: "KVCacheBlocks", num_external_tokens: int) -> None:  # cites: vllm==0.32.0 vllm/distributed/kv_transfer/kv_connector/v1/base.py:554 83e0c618; vllm==0.33.0 vllm/distributed/kv_transfer/kv_connector/v1/base.py:569 83e0c618
        return self._core.update_state_after_alloc(request, blocks, num_external_tokens)  # cites: vllm==0.32.0 vllm/v1/core/sched/scheduler.py:1289 3e1c4fed; vllm==0.33.0 vllm/v1/core/sched/scheduler.py:1482 3e1c4fed

    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> KVConnectorMetadata:  # cites: vllm==0.32.0 vllm/distributed/kv_transfer/kv_connector/v1/base.py:580 65ce76d5; vllm==0.33.0 vllm/distributed/kv_transfer/kv_connector/v1/base.py:595 65ce76d5
        return self._core.build_connector_meta(scheduler_output)  # cites: vllm==0.32.0 vllm/v1/core/sched/scheduler.py:1561 18a83014; vllm==0.33.0 vllm/v1/core/sched/scheduler.py:1789 18a83014

    # Worker half.

    def register_kv_caches(self, kv_caches: "dict[str, torch.Tensor]") -> None:  # cites: vllm==0.32.0 vllm/distributed/kv_transfer/kv_connector/v1/base.py:286 1e0c8c03; vllm==0.33.0 vllm/distributed/kv_transfer/kv_connector/v1/base.py:292 1e0c8c03
        return self._core.register_kv_caches(kv_caches)  # cites: vllm==0.32.0 vllm/v1/worker/gpu_model_runner.py:7119 db6274c3; vllm==0.33.0 vllm/v1/worker/gpu_model_runner.py:7054 db6274c3

    def start_load_kv(self, forward_context: "ForwardContext", **kwargs: Any) -> None:  # cites: vllm==0.32.0 vllm/distributed/kv_transfer/kv_connector/v1/base.py:318 f3d7c834; vllm==0.33.0 vllm/distributed/kv_transfer/kv_connector/v1/base.py:333 f3d7c834
        return self._core.start_load_kv(self, forward_context)  # cites: vllm==0.32.0 vllm/v1/worker/kv_connector_model_runner_mixin.py:85 6b21e113; vllm==0.33.0 vllm/v1/worker/kv_connector_model_runner_mixin.py:85 6b21e113

    def wait_for_layer_load(self, layer_name: str) -> None:  # cites: vllm==0.32.0 vllm/distributed/kv_transfer/kv_connector/v1/base.py:335 87e8c718; vllm==0.33.0 vllm/distributed/kv_transfer/kv_connector/v1/base.py:350 87e8c718
        return self._core.wait_for_layer_load(self, layer_name)  # cites: vllm==0.32.0 vllm/model_executor/layers/attention/kv_transfer_utils.py:51 7acef6f7; vllm==0.33.0 vllm/model_executor/layers/attention/kv_transfer_utils.py:51 7acef6f7

    def save_kv_layer(self, layer_name: str, kv_layer: "torch.Tensor", attn_metadata: "AttentionMetadata", **kwargs: Any) -> None:  # cites: vllm==0.32.0 vllm/distributed/kv_transfer/kv_connector/v1/base.py:349 148e3772; vllm==0.33.0 vllm/distributed/kv_transfer/kv_connector/v1/base.py:364 148e3772
        return self._core.save_kv_layer(self, layer_name, kv_layer, attn_metadata)  # cites: vllm==0.32.0 vllm/model_executor/layers/attention/kv_transfer_utils.py:57 27aad0c6; vllm==0.33.0 vllm/model_executor/layers/attention/kv_transfer_utils.py:57 27aad0c6

    def wait_for_save(self) -> None:  # cites: vllm==0.32.0 vllm/distributed/kv_transfer/kv_connector/v1/base.py:371 b0113e7e; vllm==0.33.0 vllm/distributed/kv_transfer/kv_connector/v1/base.py:386 b0113e7e
        return self._core.wait_for_save(self)  # cites: vllm==0.32.0 vllm/v1/worker/kv_connector_model_runner_mixin.py:92 b2cdfa0f; vllm==0.33.0 vllm/v1/worker/kv_connector_model_runner_mixin.py:92 b2cdfa0f

    def get_block_ids_with_load_errors(self) -> set[int]:  # cites: vllm==0.32.0 vllm/distributed/kv_transfer/kv_connector/v1/base.py:411 0a2834ce; vllm==0.33.0 vllm/distributed/kv_transfer/kv_connector/v1/base.py:426 0a2834ce
        return self._core.get_block_ids_with_load_errors()  # cites: vllm==0.32.0 vllm/v1/worker/kv_connector_model_runner_mixin.py:100 6bf440a8; vllm==0.33.0 vllm/v1/worker/kv_connector_model_runner_mixin.py:100 6bf440a8
