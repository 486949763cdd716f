// The Tidewater panel of Airflow's dashboard (home page): the pipelines the user may read, a page at a time, with its lag, its
// freshness against its deadline (airflow.freshness), open quarantines and open dead letters, each linking to the
// pipeline's tab on its ingest DAG. The API lists only pipelines whose ingest DAG the user may read.
import { Badge, Link, Text } from "@chakra-ui/react";
import { useState } from "react";

import { Loading, Pager, Problems, Rows, Section, airflowLink, usePipelinePage } from "../parts";

function Freshness({ seconds, deadline }: { seconds: number | null | undefined; deadline: number | null }) {
  if (seconds === null || seconds === undefined) return <>-</>;
  const shown = Math.round(seconds);
  const text = deadline ? `${shown} s of ${deadline} s` : `${shown} s`;
  if (!deadline) return <>{text}</>;
  return <Badge className="freshness" colorPalette={seconds > deadline ? "red" : "green"}>{text}</Badge>;
}

export function DashboardPanel() {
  const [offset, setOffset] = useState(0);
  const page = usePipelinePage(0, offset);
  if (!page.data) return <Loading error={page.error} what="the Tidewater pipelines" />;
  const listed = page.data.pipelines;
  return (
    <Section title="Tidewater">
      {listed.length ? (
        <Rows id="tidewater-dashboard" rowClass="dashboard-pipeline"
          head={["pipeline", "lag", "freshness (deadline)", "quarantined", "open dead letters"]}
          rows={listed.map(({ ref, summary: s }) => [
            <Link key="l" colorPalette="blue" href={airflowLink(`dags/${ref.dag_id}/plugin/tidewater-pipeline`)}>{ref.name}</Link>,
            s.lag ?? "?",
            <Freshness key="f" seconds={s.freshness_s} deadline={ref.freshness_deadline_s} />,
            s.quarantined ?? "?",
            s.open_dead_letters ?? "?",
          ])} />
      ) : <Text color="fg.muted">no pipelines you may read</Text>}
      <Pager page={page.data} onOffset={setOffset} />
      <Problems id="tidewater-dashboard-problems" nonce={0} />
    </Section>
  );
}
