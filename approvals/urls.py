from django.urls import path

from approvals import views

app_name = "approvals"

urlpatterns = [
    path("", views.inbox, name="inbox"),
    path("<uuid:pk>/", views.detail, name="detail"),
    path("<uuid:pk>/decide", views.decide, name="decide"),
    path("<uuid:pk>/reveal", views.reveal_field, name="reveal"),
]
