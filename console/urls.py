from __future__ import annotations

from django.urls import path

from console import playground, release_pages, views

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
    path("evaluation-sets/", release_pages.evaluation_sets, name="evaluation-sets"),
    path("evaluation-sets/<int:set_id>/", release_pages.evaluation_set, name="evaluation-set"),
    path("evaluation-sets/<int:set_id>/replays/", release_pages.start_replay, name="evaluation-set-replay"),
    path("replays/<int:batch_id>/", release_pages.replay_batch, name="replay-batch"),
    path("replays/<int:batch_id>/cancel/", release_pages.cancel_replay, name="replay-batch-cancel"),
    path("replays/<int:batch_id>/progress.json", release_pages.replay_batch_progress, name="replay-batch-progress"),
]
