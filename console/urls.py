from __future__ import annotations

from django.urls import path

from console import playground, views

app_name = "console"

urlpatterns = [
    path("", views.home, name="home"),
    path("runs/", views.run_list, name="runs"),
    path("runs/<uuid:run_id>/", views.run_trace, name="run"),
    path("runs/<uuid:run_id>/tool-calls.json", views.run_tool_calls, name="run-tool-calls"),
    path("runs/<uuid:run_id>/resolve-attention/", views.resolve_attention, name="run-resolve-attention"),
    path("playground/", playground.page, name="playground"),
    path("playground/runs/", playground.start, name="playground-start"),
    path("spend/", views.spend, name="spend"),
]
