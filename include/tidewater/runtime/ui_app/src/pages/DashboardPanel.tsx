// The Tidewater panel of Airflow's dashboard (home page): every pipeline the user may read, with its lag, its
// freshness against its deadline (airflow.freshness), open quarantines and open dead letters, each linking to the
// pipeline's tab on its ingest DAG. The API lists only pipelines whose ingest DAG the user may read.
import { Badge, Link, Text } from "@chakra-ui/react";

import { Loading, Problems, Rows, Section, airflowLink, usePipelineOverviews } from "../parts";

function Freshness({ seconds, deadline }: { seconds: number | null | undefined; deadline: number | null }) {
  if (seconds === null || seconds === undefined) return <>-</>;
  const shown = Math.round(seconds);
  const text = deadline ? `${shown} s of ${deadline} s` : `${shown} s`;
  if (!deadline) return <>{text}</>;
  return <Badge className="freshness" colorPalette={seconds > deadline ? "red" : "green"}>{text}</Badge>;
}

export function DashboardPanel() {
  const list = usePipelineOverviews(0);
  if (!list.data) return <Loading error={list.error} what="the Tidewater pipelines" />;
  return (
    <Section title="Tidewater">
      {list.data.length ? (
        <Rows id="tidewater-dashboard" rowClass="dashboard-pipeline"
          head={["pipeline", "lag", "freshness (deadline)", "quarantined", "open dead letters"]}
          rows={list.data.map(({ ref, o }) => [
            <Link key="l" colorPalette="blue" href={airflowLink(`dags/${ref.dag_id}/plugin/tidewater-pipeline`)}>{ref.name}</Link>,
            o ? o.status.total_lag : "?",
            <Freshness key="f" seconds={o?.freshness_s} deadline={ref.freshness_deadline_s} />,
            o ? o.quarantined.length : "?",
            o ? (o.letters.open ?? 0) : "?",
          ])} />
      ) : <Text color="fg.muted">no pipelines you may read</Text>}
      <Problems id="tidewater-dashboard-problems" nonce={0} />
    </Section>
  );
}
