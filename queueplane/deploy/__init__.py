"""Deploy: Helm values from a spec, the chart rendered with the real helm, every object checked
against the Kubernetes API schemas and the platform policy, and the release installed and watched."""
