from django.urls import path

from agents.consumers import RunEventsConsumer
from approvals.consumers import ApprovalsConsumer

websocket_urlpatterns = [
    path("ws/runs/<uuid:run_id>/", RunEventsConsumer.as_asgi()),
    path("ws/approvals/", ApprovalsConsumer.as_asgi()),
]
