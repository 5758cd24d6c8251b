from rest_framework.routers import SimpleRouter

from marketplace.api import PluginInstallViewSet, PluginViewSet, ReleaseViewSet

router = SimpleRouter(trailing_slash="")
router.register("plugins", PluginViewSet, basename="plugin")
router.register("plugin-installs", PluginInstallViewSet, basename="plugin-install")
router.register("releases", ReleaseViewSet, basename="release")

urlpatterns = router.urls
