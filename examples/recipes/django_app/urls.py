from django.urls import path

from django_app import views

urlpatterns = [
    path("signups/", views.signup),
    path("signups/on-commit/", views.signup_on_commit),
]
