# Airflow image with Tidewater, Java 17 (Spark) and the JDBC drivers. Used by docker-compose.yml.
# The Tidewater apps in Airflow's UI: the bundle built from its TypeScript sources (`make ui-bundle` does the same).
FROM node:20-bookworm-slim AS ui
COPY ui /src/ui
RUN cd /src/ui && npm ci --no-audit --no-fund --loglevel=error && npm run --silent build

FROM apache/airflow:3.3.2-python3.11
USER root
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends openjdk-17-jre-headless libxerial-sqlite-jdbc-java libpostgresql-jdbc-java \
 && rm -rf /var/lib/apt/lists/*
ENV JAVA_HOME=/usr/lib/jvm/java-17-openjdk-amd64
# The Spark Connect server (compose's spark-connect service): pyspark 4.0.x's source distribution carries it;
# unpacked in its own folder, never installed (the image's pyspark 3.5 matches the Iceberg runtime jar).
COPY constraints-spark-connect.txt /opt/spark-connect-constraints.txt
RUN python -m pip download -q --no-deps --no-binary pyspark -d /tmp/spark-connect -r /opt/spark-connect-constraints.txt \
 && mkdir -p /opt/spark-connect \
 && tar xzf /tmp/spark-connect/pyspark-*.tar.gz -C /opt/spark-connect --strip-components=1 \
 && chmod +x /opt/spark-connect/deps/bin/* && rm -rf /tmp/spark-connect
USER airflow
COPY --chown=airflow requirements.txt constraints.txt pyproject.toml README.md /opt/tidewater/
COPY --chown=airflow include /opt/tidewater/include
COPY --from=ui --chown=airflow /src/include/tidewater/runtime/ui_static /opt/tidewater/include/tidewater/runtime/ui_static
COPY --chown=airflow spark_apps /opt/tidewater/spark_apps
RUN pip install --no-cache-dir -r /opt/tidewater/requirements.txt -c /opt/tidewater/constraints.txt \
 && pip install --no-cache-dir --no-deps -e /opt/tidewater
