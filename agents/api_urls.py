from rest_framework.routers import SimpleRouter

from agents.api import AgentViewSet, RunViewSet

router = SimpleRouter(trailing_slash="")
router.register("runs", RunViewSet, basename="run")
router.register("agents", AgentViewSet, basename="agent")

urlpatterns = router.urls
