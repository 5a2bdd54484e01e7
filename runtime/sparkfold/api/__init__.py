"""The public gateway (``sparkfold api``): OpenAI and Anthropic APIs in front of one engine server.

Never imports ``sparkfold.engines``: it talks HTTP to the engine server at ``settings.engine_url``.
"""

from sparkfold.api.app import App, create_app
from sparkfold.api.server import GatewayRefused, serve

__all__ = ["App", "GatewayRefused", "create_app", "serve"]
