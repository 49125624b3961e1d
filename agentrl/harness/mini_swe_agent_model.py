"""mini-swe-agent's own OpenRouter model classes, posting to the session's adapter instead of openrouter.ai.

Installed as TOOLS/mini-swe-agent/site/agentrl_mini_model.py and named by the config agentrl writes
(`model.model_class: agentrl_mini_model.AdapterTextbasedModel`: mini-swe-agent takes a full import path
there). Run by the bundled Python, never imported by agentrl itself.

Why not litellm, mini's default model layer: importing it costs about 2.6 s of CPU at every attempt's
start (the launcher starts in 3.0 s with it, 0.35 s with this), which was most of a short attempt on 2
cores. mini's OpenRouter classes already speak the OpenAI chat API with plain `requests`; everything but
the HTTP call stays theirs: the request body, the parsing of actions and its format errors, the
observation messages, mini's retry loop, the cost bookkeeping.

What differs from their `_query`:
- the URL, the config's `api_url` (theirs is fixed to openrouter.ai, which a sandbox cannot reach);
- the read timeout, the config's `request_timeout` (theirs is 60 s, past which mini retries: on a busy
  model server a slow turn would be generated again);
- a client error (4xx but 408 and 429) ends the run at once, as litellm's context-window and
  authentication errors do in mini, instead of ten retries of a request that cannot succeed.
The key is OPENAI_API_KEY's value, sent as `Authorization: Bearer`.
"""

from __future__ import annotations

import os
from typing import Any

import requests
from minisweagent.models.openrouter_model import (  # type: ignore[import-not-found]
    OpenRouterAPIError,
    OpenRouterAuthenticationError,
    OpenRouterModel,
)
from minisweagent.models.openrouter_textbased_model import OpenRouterTextbasedModel  # type: ignore[import-not-found]
from minisweagent.models.utils.actions_toolcall import BASH_TOOL  # type: ignore[import-not-found]

RETRIED_CLIENT_ERRORS = (408, 429)


class AdapterRequestError(Exception):
    """A request the adapter refused for what it is (not for load): retrying cannot help."""


class AdapterQuery:
    tools: list[dict] = []
    abort_exceptions = [*OpenRouterModel.abort_exceptions, AdapterRequestError]

    def __init__(self, *, api_url: str, request_timeout: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._api_url = api_url
        self._timeout = request_timeout
        self._api_key = os.environ.get("OPENAI_API_KEY", "")

    def _query(self, messages: list[dict], **kwargs: Any) -> dict:
        config = self.config   # type: ignore[attr-defined]
        payload = {"model": config.model_name, "messages": messages,
                   **({"tools": self.tools} if self.tools else {}), **(config.model_kwargs | kwargs)}
        try:
            response = requests.post(self._api_url, json=payload, timeout=self._timeout,
                                     headers={"Authorization": f"Bearer {self._api_key}"})
        except requests.exceptions.RequestException as e:
            raise OpenRouterAPIError(f"request to {self._api_url} failed: {e}") from e
        status, text = response.status_code, response.text[:2000]
        if status in (401, 403):
            raise OpenRouterAuthenticationError(f"the adapter refused the key (HTTP {status}): {text}")
        if 400 <= status < 500 and status not in RETRIED_CLIENT_ERRORS:
            raise AdapterRequestError(f"HTTP {status}: {text}")
        if status >= 400:
            raise OpenRouterAPIError(f"HTTP {status}: {text}")
        return response.json()


class AdapterModel(AdapterQuery, OpenRouterModel):
    """mini.yaml's format: one `bash` tool, tool calls."""
    tools = [BASH_TOOL]


class AdapterTextbasedModel(AdapterQuery, OpenRouterTextbasedModel):
    """mini_textbased.yaml's format: one mswea_bash_command block a reply."""
