from rest_framework.routers import SimpleRouter

from tools.api import ToolViewSet

router = SimpleRouter(trailing_slash="")
router.register("tools", ToolViewSet, basename="tool")

urlpatterns = router.urls
