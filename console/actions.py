"""The console's two actions, admission and drain, sent to the speed layer's masters through
its management client; refused unless the console runs with actions allowed and the request
carries the configured token.

The check comes first and nothing is sent when it fails: a refused request changes nothing.
The token is compared in constant time and never logged.
"""

from __future__ import annotations

import hmac
import logging
from dataclasses import dataclass

from console.config import ConsoleConfig

logger = logging.getLogger(__name__)


class ActionRefused(Exception):
    """The action was not attempted: actions are off, the token is wrong, or a field is bad."""


@dataclass(frozen=True)
class ActionResult:
    action: str
    ok: bool
    message: str


def check_allowed(config: ConsoleConfig, token: str | None) -> None:
    """Raise ActionRefused unless actions are enabled and `token` is the configured one."""
    if not config.actions_enabled:
        raise ActionRefused("actions are disabled: start the console with --allow-actions and a token")
    if not token or not hmac.compare_digest(token.encode(), (config.action_token or "").encode()):
        raise ActionRefused("refused: missing or wrong action token")
    if not config.speedlayer.masters:
        raise ActionRefused("no speed-layer masters configured (speedlayer.masters)")


def admit(config: ConsoleConfig, tenant: str, dataset: str, table_uri: str, replication: int) -> ActionResult:
    """Admit the Delta table `table_uri` as `tenant`/`dataset` (the admin CLI's `admit`)."""
    from speedlayer.clients import ManagementClient, delta_request

    _require(tenant=tenant, dataset=dataset, table_uri=table_uri)
    client = ManagementClient(list(config.speedlayer.masters), deadline_s=15)
    try:
        reply = client.admit(delta_request(tenant, dataset, table_uri, replication=replication))
    finally:
        client.close()
    ok = reply.status in ("ASSIGNED", "PLANNED")
    logger.info("console action: admit %s/%s -> %s", tenant, dataset, reply.status)
    return ActionResult("admit", ok, f"{tenant}/{dataset}: {reply.status} epoch {reply.epoch_id} {reply.message}".strip())


def drain(config: ConsoleConfig, tenant: str, worker: str) -> ActionResult:
    """Drain `worker` of `tenant`: its epochs move to other workers (the admin CLI's `drain`)."""
    from speedlayer.clients import ManagementClient

    _require(tenant=tenant, worker=worker)
    client = ManagementClient(list(config.speedlayer.masters), deadline_s=15)
    try:
        reply = client.drain(tenant, worker)
    finally:
        client.close()
    logger.info("console action: drain %s/%s", tenant, worker)
    return ActionResult("drain", True, f"{tenant}/{worker}: {reply.message or 'draining'}")


def _require(**fields: str) -> None:
    for name, value in fields.items():
        if not value or not value.strip():
            raise ActionRefused(f"{name} is required")
