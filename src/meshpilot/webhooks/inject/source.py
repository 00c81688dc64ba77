"""The injector's templates and values from ``--inject-config DIR``, reloaded when the files change.

As istiod watches its mounted ``istio-sidecar-injector`` ConfigMap: a change
takes effect for the next pod; a change that does not parse (YAML or a template
in it) is logged and the last good configuration keeps serving.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import watchfiles

from meshpilot.webhooks.inject.config import InjectConfig, InjectionError, load_config_dir
from meshpilot.webhooks.inject.review import InjectionHandler
from meshpilot.webhooks.inject.template import check_templates

log = logging.getLogger(__name__)


class InjectConfigSource:
    """Holds the handler's configuration; ``run`` keeps it current."""

    def __init__(self, handler: InjectionHandler, directory: Path | None) -> None:
        self.handler = handler
        self.directory = directory

    @staticmethod
    def load(directory: Path | None) -> InjectConfig:
        """The directory's configuration (templates parsed), else the built-in one; InjectionError
        when it does not load."""
        return check_templates(load_config_dir(directory)) if directory is not None else InjectConfig()

    def reload(self) -> bool:
        """Re-read the directory; False (and the old configuration kept) when it does not load."""
        if self.directory is None:
            return False
        try:
            self.handler.config = self.load(self.directory)
        except InjectionError as err:
            log.error("injector config %s not reloaded, the last good one stays: %s", self.directory, err)
            return False
        log.info("injector config reloaded from %s", self.directory)
        return True

    async def run(self, stop: asyncio.Event) -> None:
        if self.directory is None:
            return
        async for _ in watchfiles.awatch(
            self.directory, stop_event=stop, debounce=50, step=25, ignore_permission_denied=True
        ):
            self.reload()
