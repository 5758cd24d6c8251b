from rest_framework.routers import SimpleRouter

from audit.api import ConfigChangeViewSet, ToolCallAuditViewSet

router = SimpleRouter(trailing_slash="")
router.register("audit/tool-calls", ToolCallAuditViewSet, basename="audit-tool-call")
router.register("audit/changes", ConfigChangeViewSet, basename="audit-change")

urlpatterns = router.urls
