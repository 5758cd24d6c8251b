from rest_framework.routers import SimpleRouter

from approvals.channel_api import NotificationChannelViewSet

router = SimpleRouter(trailing_slash="")
router.register("notification-channels", NotificationChannelViewSet, basename="notification-channel")

urlpatterns = router.urls
