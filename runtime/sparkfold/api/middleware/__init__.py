"""The gateway's ASGI middleware, one class per module; :func:`sparkfold.api.app.build_stack` orders them."""

from sparkfold.api.middleware.admission import Admission
from sparkfold.api.middleware.auth import Auth
from sparkfold.api.middleware.body_limit import BodyLimit
from sparkfold.api.middleware.observe import Observe
from sparkfold.api.middleware.request_id import RequestId
from sparkfold.api.middleware.server_errors import ServerErrors

__all__ = ["Admission", "Auth", "BodyLimit", "Observe", "RequestId", "ServerErrors"]
