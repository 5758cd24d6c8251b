from django.urls import path
from rest_framework.routers import SimpleRouter

from agents.api import AgentVersionViewSet, AgentViewSet, FlowVersionViewSet, FlowViewSet, RunViewSet
from agents.provider_api import ProviderViewSet
from agents.session_api import SessionViewSet
from approvals.api import ApprovalViewSet

router = SimpleRouter(trailing_slash="")
router.register("runs", RunViewSet, basename="run")
router.register("sessions", SessionViewSet, basename="session")
router.register("agents", AgentViewSet, basename="agent")
router.register("flows", FlowViewSet, basename="flow")
router.register("approvals", ApprovalViewSet, basename="approval")
router.register("providers", ProviderViewSet, basename="provider")

versions = AgentVersionViewSet.as_view({"get": "list", "post": "create"})
version = AgentVersionViewSet.as_view({"get": "retrieve", "put": "update", "patch": "partial_update", "delete": "destroy"})

flow_versions = FlowVersionViewSet.as_view({"get": "list", "post": "create"})
flow_version = FlowVersionViewSet.as_view({"get": "retrieve", "put": "update", "patch": "partial_update", "delete": "destroy"})

urlpatterns = [
    path("flows/<slug:slug>/versions", flow_versions, name="flow-version-list"),
    path("flows/<slug:slug>/versions/<int:number>", flow_version, name="flow-version-detail"),
    path("agents/<slug:slug>/versions", versions, name="agent-version-list"),
    path("agents/<slug:slug>/versions/<int:number>", version, name="agent-version-detail"),
    path("agents/<slug:slug>/versions/<int:number>/preview-impact", AgentVersionViewSet.as_view({"post": "preview_impact"}),
         name="agent-version-preview-impact"),
    *router.urls,
]
