{{/*
Names. The release name is the application's name (a DNS label of at most 53 characters), so
every suffixed name below stays within 63 characters.
*/}}
{{- define "queue-worker.name" -}}
{{- .Release.Name | trunc 53 | trimSuffix "-" -}}
{{- end -}}

{{- define "queue-worker.serviceAccountName" -}}
{{- default (include "queue-worker.name" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "queue-worker.sparkAuthSecret" -}}
{{- printf "%s-spark-auth" (include "queue-worker.name" .) -}}
{{- end -}}

{{- define "queue-worker.driverService" -}}
{{- printf "%s-driver" (include "queue-worker.name" .) -}}
{{- end -}}

{{- define "queue-worker.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (required "image.tag or image.digest must be set" .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "queue-worker.selectorLabels" -}}
app.kubernetes.io/name: queue-worker
app.kubernetes.io/instance: {{ .Release.Name | quote }}
{{- end -}}

{{- define "queue-worker.labels" -}}
{{ include "queue-worker.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: queueplane
app.kubernetes.io/managed-by: {{ .Release.Service | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | quote }}
queueplane.io/team: {{ .Values.application.team | quote }}
queueplane.io/application: {{ .Values.application.name | quote }}
{{- end -}}

{{/*
Spark settings no value may set (queueplane/deploy/spark_conf.py holds the same patterns, and
values.schema.json refuses the same names): RPC authentication and encryption, TLS, host-path
volumes, pod templates, the driver's Kubernetes credentials, credentials by name, and the
environment variables that name the Kafka properties file or Spark's secret.
*/}}
{{- define "queue-worker.refusedSparkKey" -}}
(?i)password|secret|jaas|token|credential|access[._-]?key|account\.key|key[._-]?file|keytab|keystore|truststore|^spark\.authenticate($|\.)|^spark\.network\.crypto\.|^spark\.network\.sasl\.|^spark\.io\.encryption\.|^spark\.ssl($|\.)|^spark\.kubernetes\.(driver|executor)\.volumes\.hostpath\.|^spark\.kubernetes\.(driver|executor)\.podtemplate|^spark\.kubernetes\.authenticate\.|^spark\.(executorenv|kubernetes\.driverenv|yarn\.appmasterenv)\.(queueplane_|_?spark_|java_tool_options$|jdk_java_options$|_java_options$)
{{- end -}}

{{/* What Java options of a Spark process may not hold: -Dspark.* (unchecked settings), @files,
credential-file properties, quotes and escapes. */}}
{{- define "queue-worker.refusedJavaOptions" -}}
(?i)['\"\\]|(^|\s)(@|-Dspark\.|-Djava\.security\.auth\.|-Djavax\.net\.ssl\.)
{{- end -}}

{{- define "queue-worker.javaOptionsKey" -}}
(?i)^spark\.(driver|executor|yarn\.am)\.(extra|default)JavaOptions$
{{- end -}}

{{/* Mount points, shared by the driver, the executor pod template and the Spark settings. */}}
{{- define "queue-worker.specDir" -}}/etc/queueplane/spec{{- end -}}
{{- define "queue-worker.executorDir" -}}/etc/queueplane/executor{{- end -}}
{{- define "queue-worker.kafkaDir" -}}/etc/queueplane/kafka{{- end -}}
{{- define "queue-worker.tlsDir" -}}/etc/queueplane/kafka-tls{{- end -}}
{{- define "queue-worker.sparkAuthDir" -}}/etc/queueplane/spark-auth{{- end -}}
{{- define "queue-worker.localDir" -}}/var/spark/local{{- end -}}
{{- define "queue-worker.checkpointDir" -}}/var/queueplane/checkpoints{{- end -}}

{{- define "queue-worker.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: ["ALL"]
{{- end -}}

{{/* The image's spark user (uid 185 in the Apache Spark images). */}}
{{- define "queue-worker.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 185
runAsGroup: 185
fsGroup: 185
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "queue-worker.scheduling" -}}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- range . }}
  - name: {{ . | quote }}
  {{- end }}
{{- end }}
{{- end -}}

{{/*
The executor pod template. Spark fills in the image, command, resources and environment;
this adds what Spark does not: labels, security, writable scratch space, the TLS files.
Volumes named spark-local-dir-* are used by Spark as its local directories.
*/}}
{{- define "queue-worker.executorPodTemplate" -}}
apiVersion: v1
kind: Pod
metadata:
  labels:
    {{- include "queue-worker.labels" . | nindent 4 }}
    app.kubernetes.io/component: executor
  {{- with .Values.podAnnotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  automountServiceAccountToken: false
  enableServiceLinks: false
  securityContext:
    {{- include "queue-worker.podSecurityContext" . | nindent 4 }}
  {{- with include "queue-worker.scheduling" . }}
  {{- . | trim | nindent 2 }}
  {{- end }}
  containers:
    - name: executor
      securityContext:
        {{- include "queue-worker.containerSecurityContext" . | nindent 8 }}
      volumeMounts:
        - name: tmp
          mountPath: /tmp
        - name: spark-local-dir-1
          mountPath: {{ include "queue-worker.localDir" . }}
        {{- if .Values.kafka.tlsSecret.name }}
        - name: kafka-tls
          mountPath: {{ include "queue-worker.tlsDir" . }}
          readOnly: true
        {{- end }}
  volumes:
    - name: tmp
      emptyDir: {}
    - name: spark-local-dir-1
      emptyDir: {}
    {{- if .Values.kafka.tlsSecret.name }}
    - name: kafka-tls
      secret:
        secretName: {{ .Values.kafka.tlsSecret.name | quote }}
    {{- end }}
{{- end -}}
