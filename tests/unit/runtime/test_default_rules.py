"""PAI's shipped rules explain the failures researchers actually meet."""

from __future__ import annotations

import pytest

from libs.common.messages import Reaction
from services.runtime.core import RuleEngine, default_rules
from tests.unit.runtime.builders import task_exited


@pytest.fixture(scope="module")
def engine() -> RuleEngine:
    return RuleEngine(default_rules())


TORCHRUN_SUMMARY = """\
E0304 10:31:44.120000 140 torch/distributed/elastic/multiprocessing/api.py:826] failed (exitcode: 1) \
local_rank: 0 (pid: 1402) of binary: /usr/bin/python
Traceback (most recent call last):
  File "/usr/local/bin/torchrun", line 8, in <module>
    sys.exit(main())
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2025-03-04_10:31:44
  host      : gpu-node-07
  rank      : 0 (local_rank: 0)
"""

# (id, exit code, platform reason, platform message, log tail,
#  expected code, expected phrase, text that one diagnostic line contains)
CASES = [
    (
        "pytorch-cuda-oom",
        1, "", "",
        'Traceback (most recent call last):\n  File "/work/train.py", line 212, in <module>\n    loss.backward()\n'
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
        "79.10 GiB of which 1.21 GiB is free. Of the allocated memory 74.2 GiB is allocated by PyTorch\n",
        236, "TorchCudaOutOfMemory", "Tried to allocate 2.00 GiB",
    ),
    (
        "pytorch-1x-cuda-oom-runtime-error",
        1, "", "",
        "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 10.76 GiB total capacity; "
        "9.71 GiB already allocated; 3.56 MiB free; 9.80 GiB reserved in total by PyTorch)\n",
        236, "TorchCudaOutOfMemory", "CUDA out of memory",
    ),
    (
        "torchrun-rank-prefixed-oom",
        1, "", "",
        "[rank1]: Traceback (most recent call last):\n[rank1]:   File \"/work/train.py\", line 88, in train_step\n"
        "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 MiB.\n" + TORCHRUN_SUMMARY
        + "  exitcode  : 1 (pid: 1402)\n  error_file: <N/A>\n",
        236, "TorchCudaOutOfMemory", "[rank1]: torch.OutOfMemoryError",
    ),
    (
        "legacy-cuda-runtime-error-2",
        1, "", "",
        "THCudaCheck FAIL file=/pytorch/aten/src/THC/generic/THCStorage.cu line=58 error=2 : out of memory\n"
        "RuntimeError: cuda runtime error (2) : out of memory at /pytorch/aten/src/THC/generic/THCStorage.cu:58\n",
        226, "ContainerCudaOOMKilled", "cuda runtime error (2)",
    ),
    (
        "tensorflow-oom",
        1, "", "",
        "tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when allocating tensor with "
        "shape[64,2048,28,28] and type float on /job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc\n",
        221, "ContainerTensorflowOOMKilled", "ResourceExhaustedError",
    ),
    (
        "nccl-watchdog-timeout-abort",
        134, "", "",
        "[rank3]:[E304 10:41:02.117 ProcessGroupNCCL.cpp:563] [Rank 3] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=5021, OpType=ALLREDUCE, NumelIn=262144, NumelOut=262144, Timeout(ms)=600000) ran for "
        "600034 milliseconds before timing out.\n"
        "terminate called after throwing an instance of 'c10::DistBackendError'\n",
        238, "NcclCollectiveTimeout", "Watchdog caught collective operation timeout",
    ),
    (
        "nccl-unhandled-system-error",
        1, "", "",
        "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, "
        "unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.19.3\n"
        "ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device error.\n",
        237, "NcclError", "NCCL error in",
    ),
    (
        "torchrun-rendezvous-timeout",
        1, "", "",
        "torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError\n",
        239, "TorchRendezvousTimeout", "RendezvousTimeoutError",
    ),
    (
        "process-group-socket-timeout",
        1, "", "",
        "torch.distributed.DistNetworkError: The client socket has timed out after 1800s while trying to connect "
        "to (10.0.3.17, 29500).\n",
        239, "TorchRendezvousTimeout", "client socket has timed out",
    ),
    (
        "module-not-found",
        1, "", "",
        'Traceback (most recent call last):\n  File "/work/train.py", line 7, in <module>\n'
        "    from transformers import AutoModel\nModuleNotFoundError: No module named 'transformers'\n",
        240, "PythonModuleNotFound", "No module named 'transformers'",
    ),
    (
        "import-error-missing-shared-library",
        1, "", "",
        "ImportError: libcudnn.so.8: cannot open shared object file: No such file or directory\n",
        232, "ContainerImportError", "libcudnn.so.8",
    ),
    (
        "import-error-cannot-import-name",
        1, "", "",
        "ImportError: cannot import name 'soft_unicode' from 'markupsafe' "
        "(/usr/local/lib/python3.10/dist-packages/markupsafe/__init__.py)\n",
        232, "ContainerImportError", "soft_unicode",
    ),
    (
        "data-file-not-found",
        1, "", "",
        '  File "/usr/lib/python3.10/site-packages/torchvision/datasets/folder.py", line 41, in find_classes\n'
        "    classes = sorted(entry.name for entry in os.scandir(directory) if entry.is_dir())\n"
        "FileNotFoundError: [Errno 2] No such file or directory: '/data/imagenet/train'\n",
        241, "DataFileNotFound", "/data/imagenet/train",
    ),
    (
        "syntax-error-python2-print",
        1, "", "",
        '  File "/work/train.py", line 42\n    print "epoch", epoch\n    ^^^^^^^^^^^^^^^^^^^^\n'
        "SyntaxError: Missing parentheses in call to 'print'. Did you mean print(...)?\n",
        231, "ContainerSyntaxError", "SyntaxError: Missing parentheses",
    ),
    (
        "indentation-error",
        1, "", "",
        '  File "/work/model.py", line 19\n    return x\n    ^\nIndentationError: unexpected indent\n',
        231, "ContainerSyntaxError", "IndentationError: unexpected indent",
    ),
    (
        "name-error",
        1, "", "",
        '  File "/work/train.py", line 130, in <module>\n    out = modle(batch)\n'
        "NameError: name 'modle' is not defined. Did you mean: 'model'?\n",
        231, "ContainerSyntaxError", "name 'modle' is not defined",
    ),
    (
        "bash-reports-kernel-oom-kill",
        137, "", "",
        "Tokenizing shard 14/64 ...\n"
        "/bin/bash: line 1:   812 Killed                  python preprocess.py --workers 32\n",
        242, "HostMemoryExhausted", "Killed",
    ),
    (
        "dataloader-worker-killed",
        1, "", "",
        "RuntimeError: DataLoader worker (pid 2741) is killed by signal: Killed. \n",
        242, "HostMemoryExhausted", "DataLoader worker (pid 2741)",
    ),
    (
        "numpy-cannot-allocate",
        1, "", "",
        "numpy.core._exceptions._ArrayMemoryError: Unable to allocate 74.5 GiB for an array with shape "
        "(100000, 100000) and data type float64\n",
        242, "HostMemoryExhausted", "Unable to allocate 74.5 GiB",
    ),
    (
        "torchrun-worker-sigkilled",
        1, "", "",
        TORCHRUN_SUMMARY + "  exitcode  : -9 (pid: 1402)\n  error_file: <N/A>\n"
        "  traceback : Signal 9 (SIGKILL) received by PID 1402\n",
        242, "HostMemoryExhausted", "Signal 9 (SIGKILL)",
    ),
    (
        "shared-memory-exhausted",
        1, "", "",
        "ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared memory (shm).\n"
        "RuntimeError: DataLoader worker (pid 731) is killed by signal: Bus error.\n",
        243, "SharedMemoryExhausted", "insufficient shared memory (shm)",
    ),
    (
        "checkpoint-disk-full",
        1, "", "",
        "Saving checkpoint to /output/ckpt/epoch_12.pt\n"
        "OSError: [Errno 28] No space left on device: '/output/ckpt/epoch_12.pt'\n",
        244, "DiskFull", "[Errno 28]",
    ),
    (
        "tar-disk-quota",
        2, "", "",
        "tar: ./shards/00017.tar: Cannot write: Disk quota exceeded\n"
        "tar: Exiting with failure status due to previous errors\n",
        244, "DiskFull", "Disk quota exceeded",
    ),
    (
        "command-not-found",
        127, "", "",
        "/bin/bash: line 3: torchrunn: command not found\n",
        220, "UserCommandExitWithError", "torchrunn: command not found",
    ),
    (
        "script-not-executable",
        126, "", "",
        "/bin/bash: line 1: ./scripts/train.sh: Permission denied\n",
        245, "UserCommandNotExecutable", "Permission denied",
    ),
    (
        "segfault-in-extension",
        139, "", "",
        "Fatal Python error: Segmentation fault\n\nCurrent thread 0x00007f3a (most recent call first):\n"
        '  File "/usr/lib/python3/site-packages/apex/fused.py", line 77 in forward\n'
        "Segmentation fault (core dumped)\n",
        234, "ContainerSigvFault", "Segmentation fault",
    ),
    (
        "sigsegv-without-message",
        139, "", "",
        "2025-03-04 10:22:00 INFO step=2000 loss=3.9911\n",
        139, "ContainerSigSegvReceived", "step=2000",
    ),
    (
        "sigterm",
        143, "", "",
        "2025-03-04 10:22:00 INFO step=2000 loss=3.9911\nTerminated\n",
        143, "ContainerSigTermReceived", "Terminated",
    ),
    (
        "sigkill-no-sign-of-oom",
        137, "", "",
        "2025-03-04 10:22:00 INFO step=2000 loss=3.9911\n",
        137, "ContainerSigKillReceived", "step=2000",
    ),
    (
        "sigabrt-cpp-exception",
        134, "", "",
        "terminate called after throwing an instance of 'std::out_of_range'\n  what():  vector::_M_range_check\n",
        134, "ContainerSigAbrtReceived", "std::out_of_range",
    ),
    (
        "kubernetes-evicted",
        137, "Evicted",
        "The node was low on resource: memory. Container worker was using 61Gi, which exceeds its request of 16Gi.",
        "2025-03-04 10:22:00 INFO step=2000 loss=3.9911\n",
        -1000, "PodEvicted", "Evicted: The node was low on resource: memory.",
    ),
    (
        "kubernetes-oomkilled",
        137, "OOMKilled", "",
        "2025-03-04 10:22:00 INFO step=2000 loss=3.9911\n",
        -1200, "UserContainerDockerOOMKilled", "OOMKilled",
    ),
    (
        "kubernetes-init-container-oomkilled",
        137, "Init:OOMKilled", "",
        "",
        -1300, "InitContainerDockerOOMKilled", "Init:OOMKilled",
    ),
    (
        "image-pull-backoff",
        -1, "ImagePullBackOff", 'Back-off pulling image "registry.example.com/team/pytorch:2.3-cuda12-typo"',
        "",
        254, "ContainerImageNotExists", "ImagePullBackOff",
    ),
    (
        "node-lost",
        -1, "NodeLost", "Node gpu-node-07 which was running pod worker-0 is unresponsive",
        "",
        -1001, "PodNodeLost", "NodeLost",
    ),
    (
        "gpu-driver-cannot-run",
        128, "ContainerCannotRun", "nvidia-container-cli: device error: unknown device id: 3",
        "",
        -1205, "ContainerGpuDeviceNotFoundError", "unknown device id",
    ),
    (
        "preempted-by-scheduler",
        143, "Preempted", "preempted by prod job bob~llm-pretrain",
        "2025-03-04 10:22:00 INFO step=2000 loss=3.9911\nTerminated\n",
        -410, "TaskPreempted", "Preempted",
    ),
    (
        "stopped-by-user",
        143, "Stopped", "stop requested by alice",
        "2025-03-04 10:22:00 INFO step=2000 loss=3.9911\n",
        -210, "StopFrameworkRequested", "Stopped",
    ),
    (
        "stopped-while-exiting-cleanly",
        0, "Stopped", "stop requested by alice",
        "2025-03-04 10:22:00 INFO saving final checkpoint\n",
        -210, "StopFrameworkRequested", "Stopped",
    ),
    (
        "gpu-fell-off-the-bus",
        1, "Error", "NVRM: Xid (PCI:0000:3b:00): 79, pid=1402, GPU has fallen off the bus.",
        "RuntimeError: CUDA error: unknown error\n",
        248, "GpuDeviceLost", "fallen off the bus",
    ),
    (
        "gpus-busy",
        1, "", "",
        "RuntimeError: CUDA error: all CUDA-capable devices are busy or unavailable\n",
        248, "GpuDeviceLost", "busy or unavailable",
    ),
    (
        "uncorrectable-ecc",
        1, "", "",
        "2025-03-04 10:22:00.1: E tensorflow/stream_executor/cuda/cuda_driver.cc:1010] failed to synchronize the stop "
        "event: CUDA_ERROR_ECC_UNCORRECTABLE: uncorrectable ECC error encountered\n",
        223, "ContainerCudaUncorrectableECCError", "CUDA_ERROR_ECC_UNCORRECTABLE",
    ),
    (
        "no-kernel-image-for-gpu",
        1, "", "",
        "RuntimeError: CUDA error: no kernel image is available for execution on the device\n"
        "CUDA kernel errors might be asynchronously reported at some other API call\n",
        246, "CudaNoKernelImage", "no kernel image",
    ),
    (
        "driver-too-old",
        1, "", "",
        "RuntimeError: The NVIDIA driver on your system is too old (found version 11040). Please update your GPU "
        "driver by downloading and installing a new version\n",
        224, "ContainerCudaVersionMismatch", "too old",
    ),
    (
        "no-gpu-visible",
        1, "", "",
        "RuntimeError: No CUDA GPUs are available\n",
        247, "NoCudaDeviceVisible", "No CUDA GPUs are available",
    ),
    (
        "label-out-of-range-device-assert",
        1, "", "",
        "../aten/src/ATen/native/cuda/Loss.cu:250: nll_loss_forward_reduce_cuda_kernel_2d: block: [0,0,0], thread: "
        "[5,0,0] Assertion `t >= 0 && t < n_classes` failed.\nRuntimeError: CUDA error: device-side assert triggered\n",
        233, "ContainerIndexOutOfRange", "device-side assert triggered",
    ),
    (
        "argparse-unrecognized-argument",
        2, "", "",
        "usage: train.py [-h] [--lr LR] [--epochs EPOCHS]\n"
        "train.py: error: unrecognized arguments: --learning-rate 0.1\n",
        228, "ContainerIncorrectParameterError", "unrecognized arguments",
    ),
    (
        "checkpoint-does-not-fit-model",
        1, "", "",
        "RuntimeError: Error(s) in loading state_dict for ResNet:\n"
        "\tsize mismatch for fc.weight: copying a param with shape torch.Size([1000, 2048]) from checkpoint, "
        "the shape in current model is torch.Size([10, 2048]).\n",
        229, "ContainerIncorrectDataModelError", "Error(s) in loading state_dict",
    ),
    (
        "mpi-address-not-mapped",
        1, "", "",
        "[gpu-node-02:01234] *** Process received signal ***\n[gpu-node-02:01234] Signal: Segmentation fault (11)\n"
        "[gpu-node-02:01234] Signal code: Address not mapped (1)\n",
        222, "ContainerMPISegvFault", "Address not mapped",
    ),
    (
        "ssh-barrier-gave-up",
        10, "Error", "SSH barrier reaches max retry count, waiting for roles: worker",
        "",
        249, "PAIRuntimeSSHBarrierTimeout", "SSH barrier",
    ),
    (
        "unrecognised-failure",
        3, "", "",
        "2025-03-04 10:22:00 INFO evaluating\nValueError: metric 'bleu4' is not registered\n",
        255, "PAIRuntimeUnknownFailed", "metric 'bleu4' is not registered",
    ),
]


@pytest.mark.parametrize(
    ("exit_code", "reason", "message", "log", "code", "phrase", "diagnostic"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_default_rules_explain_real_failures(engine, exit_code, reason, message, log, code, phrase, diagnostic):
    verdict = engine.classify(task_exited(exit_code, log, reason=reason, message=message))

    assert (verdict.spec.code, verdict.spec.phrase) == (code, phrase)
    assert verdict.rule_code == code
    assert any(diagnostic in line for line in verdict.diagnostics), verdict.diagnostics
    assert verdict.spec.reason, "a researcher needs an explanation"
    assert verdict.spec.solution or verdict.spec.type == "USER_STOP", "and something to do about it"


@pytest.mark.parametrize(
    ("exit_code", "log", "reaction"),
    [
        (1, "SyntaxError: invalid syntax\n", Reaction.NEVER_RETRY),
        (1, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n", Reaction.NEVER_RETRY),
        (1, "ModuleNotFoundError: No module named 'timm'\n", Reaction.NEVER_RETRY),
        (137, "step=10 loss=1.0\n", Reaction.ALWAYS_RETRY),
        (143, "Terminated\n", Reaction.ALWAYS_RETRY),
        (1, "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1)\n", Reaction.RETRY_TO_MAX),
        (1, "RuntimeError: CUDA error: all CUDA-capable devices are busy or unavailable\n",
         Reaction.ALWAYS_BACKOFF_RETRY),
    ],
    ids=["syntax-never", "cuda-oom-never", "missing-module-never", "sigkill-always", "sigterm-always",
         "nccl-timeout-to-max", "gpu-lost-backoff"],
)
def test_reactions_say_whether_a_retry_can_help(engine, exit_code, log, reaction):
    assert engine.classify(task_exited(exit_code, log)).spec.reaction == reaction


def test_success_is_not_turned_into_a_failure_by_scary_output(engine):
    log = "UserWarning: ImportError: apex not found, using native AMP\nSegmentation fault handler installed\ndone\n"

    verdict = engine.classify(task_exited(0, log))

    assert (verdict.spec.code, verdict.spec.phrase) == (0, "Succeeded")
    assert verdict.diagnostics == []


def test_kernel_oom_kill_reported_by_the_platform_log(engine):
    verdict = engine.classify(
        task_exited(
            137, "step=10\n", reason="Error", message="Memory cgroup out of memory: Killed process 1402 (python)"
        )
    )

    assert verdict.spec.phrase == "HostMemoryExhausted"


def test_every_shipped_rule_is_explained():
    for rule in default_rules():
        assert rule.reason, rule.phrase
        if rule.type not in ("USER_SUCCESS", "USER_STOP"):
            assert rule.solution, rule.phrase
