from django.urls import path

from agents.consumers import RunEventsConsumer

websocket_urlpatterns = [
    path("ws/runs/<uuid:run_id>/", RunEventsConsumer.as_asgi()),
]
