from rest_framework.routers import SimpleRouter

from releases.api import EvaluationSetViewSet, ReplayViewSet

router = SimpleRouter(trailing_slash="")
router.register("evaluation-sets", EvaluationSetViewSet, basename="evaluation-set")
router.register("replays", ReplayViewSet, basename="replay")

urlpatterns = router.urls
