"""conveyor: a durable task system for Python.

Tasks are stored in a database, claimed by workers under a lease that a
heartbeat keeps alive, fenced by that lease, retried by policy and logged
attempt by attempt. See docs/guarantees.md for what is and is not promised.
"""

# conveyor.testing comes with `import conveyor` (it needs nothing beyond the
# package itself; its pytest plugin, which needs pytest, is a module apart).
from conveyor import testing as testing
from conveyor.app import App
from conveyor.client import Client
from conveyor.composition import (
    Chain,
    ChainHandle,
    Chord,
    ChordHandle,
    Group,
    GroupHandle,
    chain,
    chord,
    group,
)
from conveyor.context import TaskContext
from conveyor.coroutine import Coroutine, Poll, PollError, Sleep, Suspend, sleep, suspend
from conveyor.dependencies import TaskOutcome
from conveyor.errors import (
    AttemptTimeoutError,
    BackendError,
    BackendUnavailableError,
    CancelledByRequest,
    ConfigurationError,
    ConveyorError,
    DuplicateTaskError,
    Fatal,
    InvalidTransitionError,
    LeaseLostError,
    NoInboxError,
    PayloadError,
    PayloadTooLargeError,
    ResultTimeoutError,
    Retry,
    Snooze,
    StopAttempt,
    StoreNotReadyError,
    TaskExistsError,
    TaskFailedError,
    TaskFinishedError,
    TaskNotFoundError,
    UnknownTaskError,
    WorkerShutdown,
)
from conveyor.explain import Explanation
from conveyor.graph import TaskGraph
from conveyor.handle import TaskHandle
from conveyor.model import (
    Attempt,
    LeaseToken,
    Message,
    MessageKind,
    Outcome,
    Progress,
    RetryPolicy,
    Task,
    TaskState,
)
from conveyor.options import Concurrency, EnqueueOptions, RateLimit, Unique
from conveyor.retention import Retention
from conveyor.signature import Signature, on_failure, on_success
from conveyor.task import BoundTask, TaskDef
from conveyor.worker import Worker, WorkerConfig
from conveyor.workflow import Done, Next, StepError, Workflow, done, next

__all__ = [
    "App",
    "Attempt",
    "AttemptTimeoutError",
    "BackendError",
    "BackendUnavailableError",
    "BoundTask",
    "CancelledByRequest",
    "Chain",
    "ChainHandle",
    "Chord",
    "ChordHandle",
    "Client",
    "Concurrency",
    "ConfigurationError",
    "ConveyorError",
    "Coroutine",
    "Done",
    "DuplicateTaskError",
    "EnqueueOptions",
    "Explanation",
    "Fatal",
    "Group",
    "GroupHandle",
    "InvalidTransitionError",
    "LeaseLostError",
    "LeaseToken",
    "Message",
    "MessageKind",
    "Next",
    "NoInboxError",
    "Outcome",
    "PayloadError",
    "PayloadTooLargeError",
    "Poll",
    "PollError",
    "Progress",
    "RateLimit",
    "ResultTimeoutError",
    "Retention",
    "Retry",
    "RetryPolicy",
    "Signature",
    "Sleep",
    "Snooze",
    "StepError",
    "StopAttempt",
    "StoreNotReadyError",
    "Suspend",
    "Task",
    "TaskContext",
    "TaskDef",
    "TaskExistsError",
    "TaskFailedError",
    "TaskFinishedError",
    "TaskGraph",
    "TaskHandle",
    "TaskNotFoundError",
    "TaskOutcome",
    "TaskState",
    "Unique",
    "UnknownTaskError",
    "Worker",
    "WorkerConfig",
    "WorkerShutdown",
    "Workflow",
    "chain",
    "chord",
    "done",
    "group",
    "next",
    "on_failure",
    "on_success",
    "sleep",
    "suspend",
]

__version__ = "0.1.0"
