from __future__ import annotations

from django.urls import path

from console.consumers import RunListConsumer

websocket_urlpatterns = [
    path("ws/console/runs/", RunListConsumer.as_asgi()),
]
