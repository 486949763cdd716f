-- A database for the Iceberg SQL catalog next to Airflow's metadata database.
CREATE DATABASE iceberg OWNER airflow;
